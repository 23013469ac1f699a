"""Fault injection: the engine bugs public engines shipped, re-created on purpose (``faults``), and the
bug-class table that measures which audit catches each (``fault_table``, docs/bug-classes.md), and
a faulty engine's answer as llama-server writes it, log-probabilities included (``answer``).

A fault rewrites the value at one of the model's and the loop's named tap points; the clean code never
imports this folder. May import everything below the command line.
"""
