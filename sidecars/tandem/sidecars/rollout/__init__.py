"""The rollout sidecar: the pod's vLLM engine (`tandem.sidecars.rollout_engine`) served over HTTP, supervised."""
