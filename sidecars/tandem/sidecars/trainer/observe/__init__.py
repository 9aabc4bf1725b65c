"""The trainer's observability: phase timers and memory per phase (`timing`, `memory`), Prometheus metrics of
the loop (`prom`), TensorBoard and MLflow (`tracking`). Used by the loop; knows no engine.
"""
