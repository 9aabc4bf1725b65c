"""The vision-language demo: a LLaVA built here from SmolLM2 (build.py), aligned by a supervised warm-up
(warmup.py), and the visual task it is trained on with RL (shapes.py)."""
