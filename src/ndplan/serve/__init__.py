"""Serving (inference) planning: weights and KV cache per device, each engine's rule for the KV
pool, capacity in tokens and concurrency (issue 17). The Terms are SymPy expressions over the
layout (``tp``, ``pp``, attention data parallelism ``dpa``) like the training ones."""

from ndplan.serve.layout import ServeLayout, WeightRecipe
from ndplan.serve.memory import kv_bytes_per_token, serve_memory_terms, weight_bytes
from ndplan.serve.engines import ENGINES, ServeEngine, kv_capacity

__all__ = ["ServeLayout", "WeightRecipe", "kv_bytes_per_token", "serve_memory_terms", "weight_bytes",
           "ENGINES", "ServeEngine", "kv_capacity"]
