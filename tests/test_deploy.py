"""deploy/: the nightly on a real GPU cluster (docs/deploy.md), checked for
structure without a cluster: the KubeRay RayCronJob's job command is one
this checkout accepts, writes where the head mounts the volume the site
server reads, asks Ray for the GPUs the pods request, and names the Ray of
pyproject.toml; the `ray up` config syncs and sets up this checkout with
token authentication, and its cron script runs a nightly command this
checkout accepts."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from jobs.__main__ import _parse_job

yaml = pytest.importorskip("yaml", reason="PyYAML comes with ray[default]")

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CRON = re.compile(r"^(\S+\s+){4}\S+$")


def _load_all(path: Path) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text()) if doc}


def _job(command: str):
    """The job command after ``python -m jobs``, as the job will parse it."""
    words = shlex.split(command)
    start = words.index("jobs") + 1
    assert words[start - 2:start] == ["-m", "jobs"], command
    job = _parse_job(words[start:])
    assert job is not None, f"the job command does not parse: {command}"
    return job


def _ray_pin() -> tuple[int, int]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [d for d in deps if d.startswith("ray")]
    low = re.search(r">=(\d+)\.(\d+)", ray)
    return int(low.group(1)), int(low.group(2))


def _mounts(container: dict) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def _claims(pod_spec: dict) -> dict[str, str]:
    return {v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod_spec.get("volumes", []) if "persistentVolumeClaim" in v}


def test_kuberay_nightly_runs_this_checkouts_nightly_on_gpu_workers():
    docs = _load_all(DEPLOY / "kuberay" / "nightly.yaml")
    cron = docs["RayCronJob"]
    assert cron["apiVersion"] == "ray.io/v1"
    assert CRON.match(cron["spec"]["schedule"]), cron["spec"]["schedule"]
    spec = cron["spec"]["jobTemplate"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["activeDeadlineSeconds"] > 0
    job = _job(spec["entrypoint"])
    assert (job.cmd, job.backend, job.trigger, job.no_results) == ("nightly", "gpu", "nightly",
                                                                   False)
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    (head_container,) = head["containers"]
    # The driver runs on the head: its rows and site go to the volume mounted there.
    claims, mounts = _claims(head), _mounts(head_container)
    (volume,) = [v for v in mounts if v in claims]
    for path in (job.results, job.site):
        assert path.is_absolute() and PurePosixPath(path).is_relative_to(mounts[volume]), path
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    major, minor = _ray_pin()
    version = tuple(int(x) for x in cluster["rayVersion"].split("."))
    assert version[:2] >= (major, minor) and version[0] == major, cluster["rayVersion"]
    images = {head_container["image"]}
    for group in cluster["workerGroupSpecs"]:
        (worker,) = group["template"]["spec"]["containers"]
        images.add(worker["image"])
        gpus = worker["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == worker["resources"]["requests"]["nvidia.com/gpu"] >= 1
        assert int(group["rayStartParams"]["num-gpus"]) == gpus  # Ray's count = the pod's
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert _mounts(worker).get("dshm") == "/dev/shm"
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in \
            group["template"]["spec"]["volumes"]
    assert len(images) == 1  # one image: the driver's code is the workers' code
    # The site server reads the same claim the head writes, the whole volume.
    site = _load_all(DEPLOY / "kuberay" / "site.yaml")
    assert site["PersistentVolumeClaim"]["metadata"]["name"] == claims[volume]
    assert "ReadWriteMany" in site["PersistentVolumeClaim"]["spec"]["accessModes"]
    pod = site["Deployment"]["spec"]["template"]["spec"]
    (nginx,) = pod["containers"]
    (served,) = [m for m in nginx["volumeMounts"] if _claims(pod).get(m["name"]) == claims[volume]]
    assert served.get("readOnly") is True and "subPath" not in served
    assert site["Service"]["spec"]["selector"] == pod_labels(site["Deployment"])


def pod_labels(deployment: dict) -> dict:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_image_sets_up_this_checkout_with_cuda_torch_and_its_commit():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^RUN .*LAMPORT_TORCH=\S*torch.* scripts/setup$", text, re.M)
    assert "LAMPORT_GIT_COMMIT=${GIT_COMMIT}" in text
    setup = (REPO / "scripts" / "setup").read_text()
    assert "LAMPORT_TORCH" in setup and "LAMPORT_VENV" in setup
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


def test_ray_up_config_syncs_this_checkout_and_starts_ray_with_token_auth():
    config = yaml.safe_load((DEPLOY / "ray-up" / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"] and len(config["provider"]["worker_ips"]) == \
        config["max_workers"]
    assert config["file_mounts"]["~/lamport-lab"] == "."
    assert "~/.ray/auth_token" in config["file_mounts"]  # Ray's default token file
    assert any(c.endswith("scripts/setup") for c in config["setup_commands"])
    head = " ".join(config["head_start_ray_commands"])
    workers = " ".join(config["worker_start_ray_commands"])
    assert "ray start --head" in head and "--num-gpus=0" in head
    assert "--address=$RAY_HEAD_IP:6379" in workers
    for starts in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        assert [c for c in starts if " start " in c and "RAY_AUTH_MODE=token" in c]


def test_ray_up_cron_script_runs_a_nightly_this_checkout_accepts():
    script = (DEPLOY / "ray-up" / "nightly.sh").read_text()
    assert (DEPLOY / "ray-up" / "nightly.sh").stat().st_mode & 0o111
    (remote,) = re.findall(r"exec \"\$config\" '([^']+)'", script)
    assert "RAY_AUTH_MODE=token" in remote
    job = _job(remote.split("&&", 1)[1])
    assert (job.cmd, job.backend, job.address) == ("nightly", "gpu", "auto")
    assert str(job.site) in script.split("rsync-down", 1)[1]  # the site it builds is fetched
