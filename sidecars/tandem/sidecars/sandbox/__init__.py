"""The code sandbox: runs untrusted Python (a completion's code against a dataset's tests, or the rollout's
`python` tool) confined, with limits, as another uid or in namespaces, or through the `sandbox` container's
server.

runner.py (`run_tests`, `isolation_mode`, `harness_command`, `run_remote`: the client side), sandbox_server.py (the
`sandbox` container, `python -m tandem.sidecars.sandbox.sandbox_server`), program.py (one program with its output,
the python tool's), code_tests.py (a dataset's tests as a `TestPlan`), types.py (limits and results), and the two
files the sandboxed interpreter runs from their paths, stdlib only: harness.py and confine.py (seccomp, Landlock,
rlimits). Callers: the codeExec reward (`tandem.sidecars.rewards.code_exec`), the python tool
(`tandem.sidecars.envs.python_tool`), the operator (the container's command) and `tandem run`.
"""
