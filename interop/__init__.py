"""langtorch.interop — where torch and JAX meet (DLPack exchange, autograd bridge)."""
