"""Model builders: the offline tiny model (tiny.py), GGUF files converted into HF directories
(gguf.py), and the cache both publish into (cache.py)."""
