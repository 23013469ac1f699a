"""The plain definition: dequantization of every weight type (``dequant``, ``dequant_iq``) and the
delta-rule recurrence step with its float64 dot product (``recurrent``). The quantized matmul's
definition is ``kernels.matmul``, built on ``dequant``.

May import: ``kernels.base``.
"""
