"""Every value that reaches a generated job file is written by the file format's rules, or refused with
the flag or key to fix: no value becomes a command line.

Property tests feed each field of the sbatch script (partition, account, QOS, time, extra options, the
job name, the run directory, the recipe path, every override) and of the Kubernetes manifests (namespace,
claim, image, the recipe's name, its run directory, its text) with control characters and shell and
YAML metacharacters. A script that is written must parse (`bash -n`), keep every ``#SBATCH`` line above
its first command (sbatch stops reading them there), and, run with stub `srun` and `scontrol`, hand
`srun` exactly the intended command line and run nothing else. Manifests must parse back to the same
objects, validate against the vendored Kubeflow CRD schemas, name their objects by DNS rules, and give
the pod the intended `recipeforge train` arguments after the kubelet's ``$(VAR)`` expansion.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from recipeforge.backends.k8s import RENDEZVOUS, K8sApi, K8sOptions, k8s_manifests, render_documents
from recipeforge.backends.slurm import SlurmOptions, sbatch_script
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from surface_testing import recipeforge, refused

jsonschema = pytest.importorskip("jsonschema", reason="the dev extra's jsonschema validates the manifests")

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "k8s"
MARKER = "/tmp/recipeforge-injected-marker"
# Text a hostile or careless value holds: line breaks and other control characters, shell syntax, YAML
# and sbatch syntax, Kubernetes' $(VAR) expansion; each piece would create MARKER if it ran.
HOSTILE = [f"\ntouch {MARKER}\n", f"$(touch {MARKER})", f"`touch {MARKER}`", f"; touch {MARKER}", "'", '"',
           "\\", "%j", "#", "\r", "\x00", "\x1b[31m", "\u2028", "$(HF_TOKEN)", "${HOME}", "*", "--", "\t",
           ": x\n- y", "{a: b}", "&anchor", "!!python/object", " ", "é", "🦙"]
text = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), max_size=4).map("".join)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture],
                    derandomize=True)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    """`srun` recording its arguments as JSON, `scontrol` answering the node list."""
    folder = tmp_path_factory.mktemp("stubs")
    (folder / "srun").write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                                 "open(os.environ['SRUN_RECORD'], 'w').write(json.dumps(sys.argv[1:]))\n")
    (folder / "scontrol").write_text("#!/bin/sh\n[ \"$1\" = show ] && echo node001\nexit 0\n")
    for name in ("srun", "scontrol"):
        (folder / name).chmod(0o755)
    return folder


def _header(script: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first line that is neither blank nor a comment."""
    out = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            out.append(line[len("#SBATCH"):].strip())
    return out


def _run_script(script: str, folder: Path, stubs: Path) -> list[str]:
    """bash -n, then the script run with the stubs; returns srun's arguments."""
    path = folder / "job.sbatch"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr + script
    record = folder / "srun.json"
    record.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SRUN_RECORD": str(record),
           "SLURM_JOB_NODELIST": "node001", "SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=folder, timeout=30)
    assert done.returncode == 0, done.stderr + script
    assert not os.path.exists(MARKER), script
    return json.loads(record.read_text())


SBATCH_FIELDS = ("partition", "account", "qos", "time", "extra", "name", "run_name", "recipe", "override")


@pytest.mark.parametrize("field", SBATCH_FIELDS)
@given(value=text)
@PROPERTY
def test_every_sbatch_field_is_written_safely_or_refused(stubs, tmp_path_factory, field, value):
    """One field at a time holds the hostile text, the others ordinary values."""
    v = {"partition": "gpu", "account": "ml", "qos": "normal", "time": "48:00:00", "extra": "--constraint=h100",
         "name": "sft", "run_name": "-a", "recipe": "sft", "override": "x", field: value}
    folder = tmp_path_factory.mktemp("sbatch")
    run_dir = folder / f"run{v['run_name']}"
    overrides = [f"description={v['override']}", "train.learning_rate=1e-4"]
    options = SlurmOptions(partition=v["partition"] or None, account=v["account"] or None, qos=v["qos"] or None,
                           time=v["time"] or None, extra=(v["extra"],) if v["extra"] else ())
    try:
        script = sbatch_script(job_name=v["name"], nodes=2, gpus_per_node=8, recipe=f"/r/{v['recipe']}.yaml",
                               overrides=overrides, run_dir=run_dir, options=options,
                               layout=[f"Plan for {v['name']}", f"Rendezvous: {v['override']}"])
    except RecipeError as exc:
        (problem,) = exc.problems
        assert problem.key and problem.hint, problem
        event(f"refused at {problem.key}")
        return
    header = _header(script)
    assert f"--output={run_dir}/slurm-%j.out" in header and "--requeue" in header and "--open-mode=append" in header
    assert "--signal=B:USR1@120" in header and any(h.startswith("--job-name=") for h in header)
    for flag in ("partition", "account", "qos", "time"):
        assert not v[flag] or f"--{flag}={v[flag]}" in header, (flag, header)
    event(f"written ({field})")
    argv = _run_script(script, folder, stubs)
    assert argv == ["--kill-on-bad-exit=1", "recipeforge", "train", f"/r/{v['recipe']}.yaml", *overrides]


@functools.cache
def _validator(api: str):
    def strict(schema):  # unknown fields refused, as `kubectl apply --validate=strict` does (SOURCE.md)
        if isinstance(schema, dict):
            schema = {k: strict(v) for k, v in schema.items()}
            if "properties" in schema and "additionalProperties" not in schema \
                    and not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
        elif isinstance(schema, list):
            schema = [strict(v) for v in schema]
        return schema

    crd = json.loads((SCHEMAS / f"{api}.schema.json").read_text())
    return jsonschema.Draft4Validator(strict(crd["openAPIV3Schema"]))


def _kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """A container command argument as the kubelet runs it: $$ is $, $(NAME) of a defined variable is its value."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


K8S_FIELDS = ("name", "description", "run_name", "namespace", "pvc", "image")


@pytest.mark.parametrize("field", K8S_FIELDS)
@given(value=text, api=st.sampled_from(list(K8sApi)))
@PROPERTY
def test_every_manifest_field_is_written_safely_or_refused(tmp_path_factory, field, value, api):
    """One field at a time holds the hostile text, the others ordinary values."""
    v = {"name": "sft", "description": "d", "run_name": "-a", "namespace": "ml", "pvc": "runs",
         "image": "ghcr.io/acme/recipeforge:1", field: value}
    name, description, run_name = v["name"], v["description"], v["run_name"]
    namespace, pvc, image = v["namespace"], v["pvc"], v["image"]
    folder = tmp_path_factory.mktemp("k8s")
    recipe = folder / "r.yaml"
    (folder / "rows.jsonl").write_text('{"text": "moo"}\n')
    recipe.write_text(yaml.safe_dump({
        "stage": "pretrain", "name": name, "description": description, "model": {"name_or_path": "tiny:llama"},
        "hardware": {"nodes": 2, "gpus_per_node": 8, "gpu": "H100-80GB"},
        "data": {"datasets": [{"path": "hub-org/corpus", "format": "text"}]},
        "output": {"dir": f"runs/r{run_name}"}}, allow_unicode=True))
    options = K8sOptions(image=image or "ghcr.io/acme/recipeforge:1", pvc=pvc or "runs",
                         namespace=namespace or None, api=api)
    try:
        loaded = load_recipe(recipe)
        docs = k8s_manifests(loaded, recipe=str(recipe), options=options).documents
    except RecipeError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        event(f"refused ({field})")
        return
    event(f"written ({field})")
    assert list(yaml.safe_load_all(render_documents(docs, str(recipe)))) == docs
    config_map, job = docs
    errors = list(_validator(str(api)).iter_errors(job))
    assert not errors, errors[0].message
    for meta in (config_map["metadata"], job["metadata"]):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63, meta
        if "namespace" in meta:
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", meta["namespace"]) and len(meta["namespace"]) <= 63
    command = job["spec"]["trainer"]["command"] if api == K8sApi.TRAINJOB else \
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    rdzv = RENDEZVOUS[api]
    env = {rdzv.nnodes: "2", rdzv.node_rank: "0", rdzv.master_addr: "job-master-0", rdzv.master_port: "29500",
           "HF_TOKEN": "hf_secret", "HOME": "/root"}
    expanded = [_kubelet_expand(a, env) for a in command]
    assert f"output.dir=/mnt/recipeforge/{Path(f'runs/r{run_name}').name}" in expanded
    assert "hf_secret" not in " ".join(expanded)
    recorded = yaml.safe_load(config_map["data"]["recipe.yaml"])
    assert recorded["output"]["dir"] == loaded.recipe.output.dir


def _executable(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_commands_refuse_or_quote_as_typed(tmp_path, stubs):
    """`recipeforge launch` as typed: refusals leave nothing behind; what is written runs as intended."""
    (tmp_path / "rows.jsonl").write_text('{"instruction": "x", "input": "", "output": "y"}\n')
    (tmp_path / "r.yaml").write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\nhardware: {gpus_per_node: 0}\n"
                                     "data:\n  datasets: [{path: rows.jsonl, format: alpaca}]\n")
    for flags, key in ((["--partition", f"gpu\ntouch {MARKER}"], "--partition"),
                       (["--time", "48:00:00; touch x"], "--time"),
                       (["--sbatch-option", f"--constraint=h100\nrm -rf {MARKER}"], "--sbatch-option"),
                       (["output.dir=runs/a\nb"], "output.dir"),
                       (["logging.wandb.api_key=0123456789abcdef0123456789abcdef01234567"], "logging.wandb.api_key")):
        err = refused(recipeforge("launch", "--slurm", "r.yaml", *flags, cwd=tmp_path), key)
        assert "hint:" in err
    assert not (tmp_path / "runs").exists() and not os.path.exists(MARKER)
    for flags, key in ((["--namespace", "ml;team"], "--namespace"), (["--pvc", "Runs Claim"], "--pvc"),
                       (["--image", "img:1\n  privileged: true"], "--image"),
                       (["description=npm_" + "a1B2" * 9], "description")):
        args = ["launch", "--k8s", "r.yaml", "--image", "ghcr.io/acme/rf:1", "--pvc", "runs", *flags]
        refused(recipeforge(*args, cwd=tmp_path), key)
    # Shell syntax in an override travels as one argument: the script hands srun the literal text.
    written = recipeforge("launch", "--slurm", "r.yaml", f"description=$(touch {MARKER}) and `id`", cwd=tmp_path)
    assert written.returncode == 0, written.stderr.decode()
    script = (tmp_path / "runs" / "r" / "slurm.sbatch").read_text()
    argv = _run_script(script, tmp_path, stubs)
    assert f"description=$(touch {MARKER}) and `id`" in argv
