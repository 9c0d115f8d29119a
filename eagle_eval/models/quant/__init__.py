"""Quantized targets: what a checkpoint holds quantized and how (`info`), and the matmuls that run held
weights (`fp8`: block-FP8 dequantizing matmul)."""
