"""Elastic restarts and rendezvous, without launching anything: the recipe keys become the launcher's
arguments (torchrun flags; accelerate's flags plus torch's PET_* defaults), validation refuses a
rendezvous no node could find (located, exit 2; as a user types `validate`: tests/commands/test_elastic.py),
the fault that kills one rank fires in the first
attempt only, a restarted group's rank 0 tidies the run directory, and the run lock tells an earlier
attempt of the same launch from another run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.backends import elastic
from recipeforge.backends.cluster import ClusterSpec
from recipeforge.cli import main

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"   # hardware: 2 nodes x 8 H100
NODE = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29555"]
TWO_NODES = ClusterSpec(nnodes=2, node_rank=1, master_addr="10.1.2.3", master_port=29555, source="flags")


def _dist(**kw):
    base = dict(max_restarts=0, rdzv_backend="static", rdzv_endpoint=None, rdzv_id=None)
    return SimpleNamespace(**{**base, **kw})


def test_static_rendezvous_keeps_the_fixed_node_flags():
    assert elastic.torchrun_args(_dist(), ClusterSpec(), Path("/r")) == ["--standalone"]
    assert elastic.torchrun_args(_dist(max_restarts=2), TWO_NODES, Path("/r")) == [
        "--max-restarts", "2", "--node_rank", "1", "--master_addr", "10.1.2.3", "--master_port", "29555"]
    assert elastic.accelerate_args(_dist(), TWO_NODES) == [] and elastic.accelerate_env(_dist(), TWO_NODES, Path("/r")) == {}


def test_c10d_rendezvous_on_torchrun_names_endpoint_and_a_shared_id():
    d = _dist(max_restarts=3, rdzv_backend="c10d", rdzv_endpoint="node001:29400")
    args = elastic.torchrun_args(d, TWO_NODES, Path("/shared/run"))
    assert args[:6] == ["--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node001:29400"]
    assert args[6] == "--rdzv-id" and args[7] == elastic.rdzv_id(d, Path("/shared/run")).strip()
    assert "--node_rank" not in args  # ranks come from the rendezvous
    # the same run directory gives every node the same id; another run another one; the recipe's wins
    assert elastic.rdzv_id(d, Path("/shared/run")) == elastic.rdzv_id(d, Path("/shared/run"))
    assert elastic.rdzv_id(d, Path("/shared/other")) != elastic.rdzv_id(d, Path("/shared/run"))
    assert elastic.rdzv_id(_dist(rdzv_id="job-42"), Path("/shared/run")) == "job-42"


def test_one_machine_c10d_without_endpoint_hosts_its_own_store():
    assert elastic.torchrun_args(_dist(rdzv_backend="c10d"), ClusterSpec(), Path("/r"))[:4] == [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]


def test_accelerate_dry_run_carries_restarts_and_rendezvous(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", str(RECIPE), f"output.dir={run}", "distributed.preset=zero3_offload", "distributed.max_restarts=3",
                 "distributed.rdzv_backend=c10d", "distributed.rdzv_endpoint=10.1.2.3:29400", "--dry-run", *NODE])
    out = capsys.readouterr().out
    assert code == 0, out
    # accelerate's launcher of this Python: `.../accelerate launch`, or `python -m accelerate.commands.launch`
    command = next(line for line in out.splitlines() if " --config_file " in line)
    assert " launch --config_file " in command or " -m accelerate.commands.launch --config_file " in command
    assert "--max_restarts 3 --rdzv_backend c10d --same_network -m recipeforge.run.worker " in command
    assert "PET_RDZV_ENDPOINT=10.1.2.3:29400" in out.splitlines()
    assert f"PET_RDZV_ID={elastic.rdzv_id(_dist(), run)}" in out.splitlines()
    assert "rdzv_backend: c10d" in out.splitlines()  # the config file says what the command line does


def test_accelerate_and_torch_read_what_is_passed(monkeypatch):
    """The installed accelerate has these flags, and torch's parser takes the PET_* defaults."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    args = launch_command_parser().parse_args(["--max_restarts", "3", "--rdzv_backend", "c10d", "--same_network",
                                               "-m", "recipeforge"])
    assert (args.max_restarts, args.rdzv_backend, args.same_network) == (3, "c10d", True)
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "node001:29400")
    monkeypatch.setenv("PET_RDZV_ID", "job-42")
    parsed, _ = get_args_parser().parse_known_args(["x.py"])
    assert (parsed.rdzv_endpoint, parsed.rdzv_id) == ("node001:29400", "job-42")


def test_validate_accepts_c10d_on_one_machine_and_with_an_endpoint(tmp_path, capsys):
    from rf_testing import MINIMAL

    for extra in ("distributed:\n  rdzv_backend: c10d\n  max_restarts: 2\n",
                  "distributed:\n  rdzv_backend: c10d\n  rdzv_endpoint: node001:29400\nhardware:\n  nodes: 2\n"):
        path = tmp_path / "r.yaml"
        path.write_text(MINIMAL + extra)
        (tmp_path / "data.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
        assert main(["validate", str(path)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "1"}, 5),
    ({"RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"}, 5),
    ({"RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1"}, None),   # a restarted worker runs through
    ({"RANK": "0"}, None),
])
def test_the_rank_kill_fault_fires_on_its_rank_in_the_first_attempt_only(monkeypatch, env, expected):
    from recipeforge.outputs.atomic import rank_kill_step

    for key in ("RANK", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert rank_kill_step("kill:1:5") == expected
    assert rank_kill_step("step:5") is None and rank_kill_step("kill:x:5") is None


def _checkpoint(root: Path, step: int) -> Path:
    from recipeforge.outputs.atomic import write_marker
    from recipeforge.outputs.manifest import MANIFEST, write_manifest

    path = root / "checkpoints" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * step)
    write_manifest(path, skip=("checkpoint_complete.json",))
    write_marker(path, step, manifest=MANIFEST)
    return path


def test_a_restarted_rank_0_tidies_and_resumes_from_the_newest_intact_checkpoint(tmp_path, monkeypatch):
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.run import restarts

    run = RunDir(tmp_path)
    _checkpoint(tmp_path, 3)
    newest = _checkpoint(tmp_path, 6)
    staged = tmp_path / "checkpoints" / ".staging" / "checkpoint-9"  # the killed attempt's half-written save
    staged.mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"split": "train", "step": s, "loss": 1.0}) + "\n"
                                                    for s in range(1, 9)))
    logged = []
    monkeypatch.setattr(restarts, "log", logged.append)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restarts.is_restart() and not restarts.finished_earlier(run)
    assert restarts.tidy_after_failure("auto", run) == newest
    assert not (tmp_path / "checkpoints" / ".staging").exists()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert logged == [f"restart 1 of the worker group after a worker failed: resuming from {newest}; steps 7-8 run again"]
    # a checkpoint named in the recipe gives way to a newer one of this run
    assert restarts._choice(str(tmp_path / "checkpoints" / "checkpoint-3"), run) == newest
    (tmp_path / "final").mkdir()
    assert restarts.finished_earlier(run)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not restarts.finished_earlier(run)  # a first attempt on a finished run is the run guard's to refuse


def test_the_run_lock_tells_an_earlier_attempt_of_this_launch_from_another_run(monkeypatch):
    from recipeforge.outputs import run_lock

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    record = run_lock.holder_info()
    assert (record["launch"], record["attempt"]) == ("job-42", 0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert run_lock._earlier_attempt({**record, "host": "another-node"})
    assert not run_lock._earlier_attempt({**record, "launch": "job-7"})        # another launch
    assert not run_lock._earlier_attempt({k: v for k, v in record.items() if k not in ("launch", "attempt")})
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert not run_lock._earlier_attempt(record)                               # not an elastic worker


def test_restart_keys_do_not_make_another_run():
    from recipeforge.outputs.run_guard import recipe_diff

    old = {"stage": "sft", "distributed": {"backend": "ddp", "max_restarts": 0, "rdzv_backend": "static"}}
    new = {"stage": "sft", "distributed": {"backend": "ddp", "max_restarts": 3, "rdzv_backend": "c10d",
                                           "rdzv_endpoint": "n1:29400", "rdzv_id": "x"}}
    assert recipe_diff(old, new) == []


def test_a_worker_whose_peer_died_says_so_instead_of_asking_for_a_bug_report(monkeypatch):
    from recipeforge.backends.peer_loss import lost_peer_message

    gone = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:406. This is ...")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert lost_peer_message(gone) is None                    # one process: no peer to lose
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    message = lost_peer_message(gone)
    assert message.startswith("worker 0 lost its connection to another worker of the job")
    assert "the launcher restarts the worker group" in message and "Connection closed by peer" in message
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")    # the last attempt: no restart follows
    assert "restarts" not in lost_peer_message(gone)
    assert lost_peer_message(RuntimeError("shape mismatch")) is None
