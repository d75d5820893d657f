"""The networks both flows share: weights lookup and identity, backends, model cache, one module per network."""
