"""The Kubernetes manifests (k8s/) against what the course's launchers need. No cluster runs here:
these check the fields, torchrun's reading of them and the training script's, not a deployment.

Kubeflow's training operator turns a PyTorchJob's elasticPolicy into torchrun's PET_* variables
(kubeflow/training-operator, pkg/controller.v1/pytorch/elastic.go): PET_NNODES=min:max,
PET_RDZV_BACKEND, PET_RDZV_ENDPOINT=<job>-worker-0:<the port named pytorchjob-port of the container
named pytorch>, PET_MAX_RESTARTS. torchrun reads PET_<FLAG> for each flag not on its command line.
"""

import os
import re

import pytest
import yaml

from conftest import ROOT
from lessons.bylesson import elastic

MANIFEST = ROOT / "k8s" / "pytorchjob_elastic.yaml"


@pytest.fixture(scope="module")
def job():
    return yaml.safe_load(MANIFEST.read_text())


def worker(job):
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    return spec, spec["template"]["spec"]


def container(job):
    return next(c for c in worker(job)[1]["containers"] if c["name"] == "pytorch")


def operator_env(job):
    """What the training operator adds to each pod of an elastic PyTorchJob (elastic.go)."""
    policy = job["spec"]["elasticPolicy"]
    port = next(
        p["containerPort"] for p in container(job)["ports"] if p["name"] == "pytorchjob-port"
    )
    return {
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_RDZV_ENDPOINT": f"{job['metadata']['name']}-worker-0:{port}",
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
    }


def test_an_elastic_pytorchjob_between_one_and_two_pods(job):
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    policy = job["spec"]["elasticPolicy"]
    spec, _ = worker(job)
    assert policy["rdzvBackend"] == "c10d"  # lesson 04c's rendezvous (the operator's only one)
    assert 1 <= policy["minReplicas"] < policy["maxReplicas"] == spec["replicas"]
    assert spec["restartPolicy"] == "OnFailure"  # a pod that failed is started again and rejoins


def test_torchrun_reads_the_rendezvous_the_operator_sets(job, monkeypatch):
    from torch.distributed.run import get_args_parser

    c = container(job)
    assert c["command"] == ["torchrun"]
    for name, value in operator_env(job).items():
        monkeypatch.setenv(name, value)
    args = get_args_parser().parse_args(c["args"])
    policy = job["spec"]["elasticPolicy"]
    assert args.nnodes == f"{policy['minReplicas']}:{policy['maxReplicas']}"
    assert (args.rdzv_backend, args.max_restarts) == ("c10d", policy["maxRestarts"])
    assert args.rdzv_endpoint == f"trainup-elastic-worker-0:{c['ports'][0]['containerPort']}"
    assert args.nproc_per_node == "1" and args.training_script == "scripts/_trainup_ddp.py"
    # lesson 04c's agents need this for every attempt's store; the pod passes it to its agent
    assert {e["name"]: e["value"] for e in c.get("env", [])}.items() >= elastic.ENV.items()


def test_the_script_accepts_its_flags_and_resumes_from_a_folder_every_pod_sees(job):
    import _trainup_ddp

    c = container(job)
    script_args = c["args"][c["args"].index("scripts/_trainup_ddp.py") + 1 :]
    args = _trainup_ddp.parse_args(script_args)
    assert args.resume  # a restarted or returning pod goes on from the last checkpoint
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    shared = [path for path in mounts if str(args.checkpoint_dir).startswith(path + "/")]
    assert shared, f"--checkpoint-dir {args.checkpoint_dir} is on no mounted volume"
    volume = next(v for v in worker(job)[1]["volumes"] if v["name"] == mounts[shared[0]])
    assert "persistentVolumeClaim" in volume  # not a pod's own disk: any pod may resume from it


def test_the_image_holds_the_pinned_packages_and_the_scripts():
    dockerfile = (ROOT / "k8s" / "Dockerfile").read_text()
    assert re.search(r"^RUN pip install .*-r requirements\.txt", dockerfile, re.M)
    assert re.search(r"^COPY scripts/ scripts/", dockerfile, re.M)
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.M).group(1)
    assert f"PYTHONPATH={workdir}/scripts" in dockerfile  # `import trainup`, as in the .venv
    assert all(os.path.exists(ROOT / p) for p in ("requirements.txt", "scripts", "data"))


# KubeRay's RayJob (k8s/rayjob.yaml): a Ray cluster of a head pod and worker pods, the script
# submitted to it (the submitter sets RAY_ADDRESS), the cluster deleted at the end.
RAYJOB = ROOT / "k8s" / "rayjob.yaml"


@pytest.fixture(scope="module")
def rayjob():
    return yaml.safe_load(RAYJOB.read_text())


def pods(rayjob):
    spec = rayjob["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def test_a_rayjob_with_the_courses_ray_and_image(rayjob, job):
    from trainup.engines import ray_run

    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True  # no idle cluster left to pay for
    pinned = ray_run.PIN.split("==")[1]
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == pinned
    assert f"ray[default,train]=={pinned}" in (ROOT / "requirements.txt").read_text().split()
    images = {c["image"] for group in pods(rayjob) for c in group["template"]["spec"]["containers"]}
    assert images == {container(job)["image"]}  # the one image, built from k8s/Dockerfile


def test_the_script_fits_the_cluster_and_checkpoints_where_every_pod_sees(rayjob):
    import shlex
    import _trainup_ray

    words = shlex.split(rayjob["spec"]["entrypoint"])
    assert words[:2] == ["python", "scripts/_trainup_ray.py"]
    args = _trainup_ray.parse_args(words[2:])
    assert args.max_failures >= 1  # a worker lost is started again from the last checkpoint
    head, *workers = pods(rayjob)
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head runs only the driver
    # ScalingConfig asks for 1 CPU per worker: the worker pods must hold them all
    cpus = sum(
        int(g["replicas"]) * int(c["resources"]["limits"]["cpu"])
        for g in workers
        for c in g["template"]["spec"]["containers"]
    )
    assert cpus >= args.ray_workers
    # Ray's storage (<checkpoint-dir>/ray) must be one folder for the driver and every worker
    for group in pods(rayjob):
        spec = group["template"]["spec"]
        mounts = {m["mountPath"]: m["name"] for c in spec["containers"] for m in c["volumeMounts"]}
        shared = [path for path in mounts if args.checkpoint_dir.startswith(path + "/")]
        assert shared, f"--checkpoint-dir {args.checkpoint_dir} is on no volume of {group}"
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[shared[0]])
        assert "persistentVolumeClaim" in volume


def test_a_ray_job_joins_the_running_cluster_and_a_run_alone_starts_its_own():
    from types import SimpleNamespace
    from trainup.engines import ray_run

    args = SimpleNamespace(ray_workers=2)
    joined = ray_run.init_args(args, 0, "/tmp/r", address="10.0.0.5:6379")
    assert joined["address"] == "10.0.0.5:6379" and "num_cpus" not in joined  # the cluster's own
    alone = ray_run.init_args(args, 0, "/tmp/r")
    assert alone["address"] == "local" and alone["num_cpus"] == 2
    assert alone["dashboard_host"] == "127.0.0.1"  # offline: nothing listens beyond this machine
