"""`python -m tandem.sidecars.rollout`: the rollout container's entry point.

Refuses to start, with one line naming the file and `spec.model.path` (also the termination message),
when the model directory has no readable config.json or no tokenizer files (`tandem.spec.model_dir`).
Starts vLLM with dummy weights (`RolloutEngine`, given a `puller.TransportPuller` as its version source:
versions not in this pod's shm are pulled from other pods first), starts this pod's broadcast node (serves the
versions it holds), loads the newest published version if there is one (a late joiner or a
restarted pod), advertises its address and gang generation
under `keys.endpoint(..., "rollout")` in etcd (lease-bound: it vanishes when the lease expires), and
keeps its engine serving (`supervisor.EngineSupervisor`: a dead, hung or half-reloaded vLLM is started again at
the newest version; the pod is not ready meanwhile; with rollout.spareEngine it keeps a spare engine started
ahead, which a restart adopts: `spare.SpareEngine`), and
serves the control + generation API on TANDEM_CE_PORT, with the OpenAI-compatible chat endpoint and, for
a job with turns (rollout.environment), its multi-turn driver or agent driver (the environment's modules are
imported before vLLM starts: a bad entryPoint or tool is refused at once, naming the field). Caller: the pod built by
`tandem.operator.manifests.builders`, or `tandem run`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.endpoints import split_endpoints
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.sidecars import gpu, gpu_share, picture_files
from tandem.sidecars.envs import factory
from tandem.sidecars.envs.env_pictures import PictureRules
from tandem.sidecars.picture_files import tokens_per_picture
from tandem.sidecars.rollout import cores
from tandem.sidecars.rollout.advertise import keep_advertised
from tandem.sidecars.rollout.kept import GangFollower
from tandem.sidecars.rollout.puller import TransportPuller
from tandem.sidecars.rollout.supervisor import EngineSupervisor
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.spare import SpareEngine
from tandem.sidecars.serve import start_server, wait_until_stopped
from tandem.sidecars.startup import etcd_security, freeze_start_up, leave, refuse, start_sidecar
from tandem.spec import devices, model_dir, seeds
from tandem.spec.data import Images
from tandem.spec.models import JobSpec
from tandem.spec.podenv import PodEnv
from tandem.spec.trainer import image_token, vision_language

log = logging.getLogger("tandem.rollout")


def engine_config(env: PodEnv, spec: JobSpec) -> EngineConfig:
    """vLLM's settings from the job: dtype (= the trainer's), memory share, CUDA graphs, sleep mode
    (`tandem.spec.devices`), context length (`model_dir.context_length`, which the trainer checks every
    prompt against), on CPU the cores it reserves, with trainer.lora.sync adapter the LoRA rank it serves, and
    the pod's sampling seed (`seeds.engine_seed` of spec.seed), and whether it records routed experts
    (algorithm.routingReplay, `devices.routing_replay`)."""
    vllm = devices.vllm_settings(spec)
    config = model_dir.read_config(spec.model.path, "spec.model.path")
    return EngineConfig(shm_root=env.shm_dir, job=env.job, tensor_parallel=spec.rollout.tensor_parallel,
                        max_model_len=model_dir.context_length(spec.rollout, config), dtype=vllm.dtype,
                        gpu_memory_utilization=vllm.gpu_memory_utilization, enforce_eager=vllm.enforce_eager,
                        enable_sleep_mode=vllm.enable_sleep_mode,
                        lora_rank=spec.trainer.lora.rank if devices.adapter_sync(spec) and spec.trainer.lora else None,
                        cpu_reserved_cores=cores.reserved_cores(spec, rollout_only=env.rollout_only,
                                                                cores=len(os.sched_getaffinity(0))),
                        seed=seeds.engine_seed(spec.seed, env.pod_index, env.rollout_only),
                        routing_replay=devices.routing_replay(spec))


def chat_and_turns(engine: RolloutEngine, spec: JobSpec, env: PodEnv, loaded: Any) -> tuple[Any, Any]:
    """The OpenAI-compatible endpoint (always) and the job's multi-turn driver (rollout.environment with
    turns; None for single replies): a MultiTurnDriver, or for type agent an AgentDriver whose agents call
    the endpoint on this pod. `loaded`: `factory.load_environment`'s."""
    from transformers import AutoTokenizer

    from tandem.sidecars.envs.chat import ChatRenderer
    from tandem.sidecars.envs.recorder import Recorder
    from tandem.sidecars.rollout.openai_api import Chat
    from tandem.sidecars.rollout_engine.turns import TurnLoop

    environment = spec.rollout.environment
    tokenizer = AutoTokenizer.from_pretrained(spec.model.path)
    lim = factory.limits(environment, spec.rollout.max_tokens)
    recorder = Recorder(max_calls=lim.max_turns, max_turn_tokens=lim.max_turn_tokens,
                        max_total_tokens=lim.max_total_tokens)
    chat = Chat(TurnLoop(engine), tokenizer, recorder, model=spec.model.path, max_tokens=spec.rollout.max_tokens,
                style=environment.tool_call_format if environment else "hermes")
    if environment is None or environment.type == "single":
        return chat, None
    if environment.type == "agent":
        from tandem.sidecars.envs.agent import AgentDriver

        return chat, AgentDriver(loaded, environment.kwargs, recorder,
                                 ChatRenderer(tokenizer), f"http://127.0.0.1:{env.port}", env.token,
                                 seconds=environment.trajectory_timeout_seconds)
    from tandem.sidecars.envs.multi_turn import MultiTurnDriver

    pictures, token = picture_rules(spec)
    return chat, MultiTurnDriver(engine, tokenizer, loaded, lim, pictures=pictures, image_token=token)


def picture_rules(spec: JobSpec) -> tuple[PictureRules | None, int | None]:
    """A vision-language model's rules for the pictures of its conversations, and its image token (None, None for a
    text model): the image tokens per picture, rollout.environment.maxPictures, dataset.images' pixel limit."""
    from transformers import AutoConfig

    if not vision_language(spec.model.path):
        return None, None
    config = model_dir.read_config(spec.model.path, "spec.model.path")
    limits = spec.dataset.images or Images()
    environment = spec.rollout.environment
    return (PictureRules(tokens_per_picture(spec.model.path, config),
                         environment.max_pictures if environment is not None else 0,
                         picture_files.Limits(limits.max_per_prompt, limits.max_pixels, limits.resize)),
            image_token(AutoConfig.from_pretrained(spec.model.path)))


def main() -> int:
    started = start_sidecar(log)
    if started is None:
        return 2
    env, job = started
    try:  # gpusPerPod > 0: CUDA or a clear refusal, never vLLM on the CPU (first, as the trainer does)
        if env.gpu_ids_file is not None and not env.rollout_only:  # exactly the trainer's GPUs (devicePlugin)
            gpu_share.adopt(gpu_share.wait_for(env.gpu_ids_file, port=env.port))
        gpu.select(job.spec.gpus_per_pod, "rollout")
    except gpu.NoUsableGpu as e:
        return refuse(log, str(e), 3)
    try:
        model_dir.check(job.spec.model.path, "spec.model.path", tokenizer=True)
    except model_dir.ModelDirError as e:
        return refuse(log, str(e))
    try:  # the environment's modules and tools, before vLLM starts: a bad entryPoint fails fast, named
        loaded = factory.load_environment(job.spec.rollout.environment)
    except factory.EnvironmentLoadError as e:
        return refuse(log, str(e))
    from tandem.sidecars.rollout.http_app import build_app

    spec = job.spec
    etcd = split_endpoints(env.etcd_endpoints)  # every member: the registry fails over among them
    registry = SyncRegistry(etcd, env.namespace, env.job, env.pod, "rollout", uid=env.job_uid,
                            security=etcd_security(env)).connect()
    node = BroadcastNode(registry, env.shm_dir, transport=spec.checkpoint_engine.transport,
                         advertise=env.pod_ip, port=env.shard_port, token=env.token).start()
    node.announce_local()
    stopping = threading.Event()
    gave_up: list[str] = []
    engine = RolloutEngine(engine_config(env, spec), registry, source=TransportPuller(node))
    try:
        engine.start(spec.model.path, dummy=True)
        if registry.latest() is not None:
            try:
                engine.update(None)
            except errors.CheckpointEngineError as e:  # its holders gone (a gang restart): the driver sends one
                log.warning("could not load the latest version at start (%s); serving once the driver sends one", e)
        chat, turns = chat_and_turns(engine, spec, env, loaded)
        app = build_app(engine, env.token, turns, chat)
        server, thread = start_server(app, env.port, "rollout-api")
        freeze_start_up()  # the collections that per-token objects trigger walk only what came after
        endpoint = keys.endpoint(registry.namespace, registry.scope, env.pod, "rollout")
        record = {"address": env.address, "ready": True, "pod": env.pod, "rolloutOnly": env.rollout_only,
                  "generation": env.restart_generation}

        def advertise() -> None:
            registry.put_json(endpoint, record, lease=True)
            node.announce_local()

        def ready(serving: bool) -> None:  # the driver admits only ready rollouts (re-admits at its version)
            record["ready"] = serving
            try:
                registry.put_json(endpoint, record, lease=True)
            except Exception as e:  # noqa: BLE001 - etcd away: the driver still finds it out over HTTP
                log.warning("could not mark this rollout %s in etcd: %s", "ready" if serving else "not ready", e)

        def give_up(reason: str) -> None:
            gave_up.append(reason)
            server.should_exit = True

        registry.put_json(endpoint, record, lease=True)
        follower = GangFollower(registry, node, env.shm_dir, env.job, record, endpoint) if env.rollout_only else None
        keep_advertised(registry, advertise, stopping,  # again after a lost lease; kept pods follow a new gang
                        tick=follower.tick if follower is not None else None)
        supervisor = EngineSupervisor(engine, spec.model.path, float(spec.failure_policy.rollout_stall_seconds),
                                      ready=ready, has_version=lambda: registry.latest() is not None,
                                      cpu_progress=spec.gpus_per_pod == 0)
        supervisor.run(stopping, give_up)
        if spec.rollout.spare_engine:  # started ahead, idle: a restart adopts it (spare.py)
            engine.spare = SpareEngine(engine.cfg, spec.model.path)
            engine.spare.prepare()
        wait_until_stopped(server, thread)
    finally:
        stopping.set()
        engine.terminate()
        if engine.spare is not None:
            engine.spare.close()
        node.close()
        registry.close()
    if gave_up:  # the kubelet (or tandem run) starts the container again; the operator replaces the pod
        return refuse(log, f"pod {env.pod}, rollout: {gave_up[0]}", 1)
    return 0


if __name__ == "__main__":
    leave(main())
