"""The plain definition: dequantization of every weight type (``dequant``, ``dequant_iq``), the
float64 dot product (``dot``: ``dot64``), and the compiled delta-rule step (``recurrent``; its definition is
the numpy form in ``refimpl/model/deltanet.py``). The quantized matmul's definition is
``kernels.matmul``'s numpy path, built on gguf's dequantization, which ``dequant`` equals.

May import: ``kernels.base``.
"""
