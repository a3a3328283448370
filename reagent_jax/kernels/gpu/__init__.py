"""GPU kernels: cuDNN flash attention (through `jax.nn.dot_product_attention`) for training and
scoring."""
