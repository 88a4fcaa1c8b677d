"""scripts/cloud_tpu.py: --help, exact --dry-run commands, the supervisor's decisions, bad options.

Nothing here reaches the network: commands are printed (dry run) or answered by a fake runner, and
the remote bash (the restart loop, the detached launch) runs locally with fake `gcloud` and
`concise-train` executables on PATH.
"""

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import time

import pytest
from loading import load

ROOT = pathlib.Path(__file__).resolve().parents[1]


cloud_tpu = load("scripts/cloud_tpu.py")

TARGET = ["--zone", "us-central2-b", "--name", "lm-tpu"]
RUN = ["--run-dir", "gs://my-bucket/runs/lm", "--config", "tiny_lm", "--set", "training.train_steps=200"]
SSH = "gcloud compute tpus tpu-vm ssh lm-tpu --zone=us-central2-b --worker=all"
INSTALL = (
    f"{SSH} '--command=gcloud storage cp gs://my-bucket/runs/lm/launcher/concise-attention.tar.gz "
    '"$HOME/concise-attention.tar.gz" && python3 -m pip install --upgrade pip && '
    'python3 -m pip install "$HOME/concise-attention.tar.gz" && python3 -m pip uninstall -y tensorflow && '
    "python3 -m pip install tensorflow-tpu==2.20.0 && python3 -m pip install --force-reinstall --no-deps tensorflow-tpu==2.20.0'"
)
LOOP = (
    'export PATH="$HOME/.local/bin:$PATH"; log="$HOME/concise-train.log"; '
    '(while sleep 300; do gcloud storage cp "$log" gs://my-bucket/runs/lm/launcher/"$(hostname).log"; done) 9>&- & copier=$!; '
    'restarts=0; while true; do echo "$(date -u +%FT%TZ) concise-train start (restart $restarts)" >> "$log"; '
    "concise-train --config tiny_lm --run-dir gs://my-bucket/runs/lm --strategy tpu --tpu local "
    '--set training.train_steps=200 >> "$log" 2>&1; code=$?; '
    'echo "$(date -u +%FT%TZ) concise-train exit code $code" >> "$log"; '
    'if [ "$code" -ne 75 ] || [ "$restarts" -ge 100 ]; then break; fi; restarts=$((restarts + 1)); sleep 10; done; '
    'kill "$copier"; gcloud storage cp "$log" gs://my-bucket/runs/lm/launcher/"$(hostname).log"; '
    'echo "$code" | gcloud storage cp - gs://my-bucket/runs/lm/launcher/status'
)
TRAIN_REMOTE = (
    'exec 9>>"$HOME/.concise-train.lock"; '
    'if ! flock -n 9; then echo "concise-train is already running on $(hostname)" >&2; exit 1; fi; '
    "echo running | gcloud storage cp - gs://my-bucket/runs/lm/launcher/status || exit 1; "
    f"setsid nohup bash -c {shlex.quote(LOOP)} > /dev/null 2>&1 < /dev/null &"
)
TRAIN = f"{SSH} {shlex.quote('--command=' + TRAIN_REMOTE)}"
TARBALL = ROOT / "dist" / "concise-attention.tar.gz"
STAGE = [
    f"mkdir -p {ROOT / 'dist'}",
    f"git -C {ROOT} archive --format=tar.gz --prefix=concise-attention/ -o {TARBALL} HEAD",
    f"gcloud storage cp {TARBALL} gs://my-bucket/runs/lm/launcher/concise-attention.tar.gz",
]


def _dry_run(capsys, *argv):
    assert cloud_tpu.main([*argv, "--dry-run"]) == 0
    return capsys.readouterr().out.splitlines()


# --help -------------------------------------------------------------------------------------

SUBCOMMANDS = (
    "create",
    "install",
    "train",
    "up",
    "supervise",
    "status",
    "logs",
    "tensorboard",
    "upload-data",
    "delete",
)


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cloud_tpu.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_help_of_each_subcommand(capsys, subcommand):
    with pytest.raises(SystemExit) as exit_info:
        cloud_tpu.main([subcommand, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: cloud_tpu.py {subcommand} ")
    assert "--dry-run" in out


# --dry-run: the exact commands --------------------------------------------------------------


def test_create_spot_tpu_vm_in_a_project(capsys):
    assert _dry_run(capsys, "create", *TARGET, "--spot", "--project", "my-project") == [
        "gcloud compute tpus tpu-vm create lm-tpu --zone=us-central2-b --accelerator-type=v4-8 "
        "--version=tpu-ubuntu2204-base --spot --project=my-project"
    ]


def test_create_queued_resource_picks_the_runtime_of_the_generation(capsys):
    assert _dry_run(capsys, "create", *TARGET, "--queued", "--accelerator-type", "v6e-8", "--spot") == [
        "gcloud compute tpus queued-resources create lm-tpu-qr --node-id=lm-tpu --zone=us-central2-b "
        "--accelerator-type=v6e-8 --runtime-version=v2-alpha-tpuv6e --spot"
    ]
    assert _dry_run(capsys, "create", *TARGET, "--preemptible", "--runtime-version", "tpu-vm-tf-2.16.1-pjrt") == [
        "gcloud compute tpus tpu-vm create lm-tpu --zone=us-central2-b --accelerator-type=v4-8 "
        "--version=tpu-vm-tf-2.16.1-pjrt --preemptible"
    ]


def test_up_stages_creates_installs_and_trains(capsys):
    assert _dry_run(capsys, "up", *TARGET, "--spot", *RUN) == [
        *STAGE,
        "gcloud compute tpus tpu-vm create lm-tpu --zone=us-central2-b --accelerator-type=v4-8 "
        "--version=tpu-ubuntu2204-base --spot",
        INSTALL,
        TRAIN,
    ]


def test_up_with_a_queued_resource_waits_for_it_before_installing(capsys):
    lines = _dry_run(capsys, "up", *TARGET, "--queued", *RUN)
    assert lines[3:5] == [
        "gcloud compute tpus queued-resources create lm-tpu-qr --node-id=lm-tpu --zone=us-central2-b "
        "--accelerator-type=v4-8 --runtime-version=tpu-ubuntu2204-base",
        "gcloud compute tpus queued-resources describe lm-tpu-qr --zone=us-central2-b '--format=value(state.state)'",
    ]
    assert lines[:3] == STAGE and lines[5:] == [INSTALL, TRAIN]


def test_install_from_a_pip_requirement_without_the_tpu_swap(capsys):
    assert _dry_run(
        capsys, "install", *TARGET, "--package", "git+https://example.com/concise-attention@v1", "--tf-package", "none"
    ) == [
        f"{SSH} '--command=python3 -m pip install --upgrade pip && "
        "python3 -m pip install git+https://example.com/concise-attention@v1'"
    ]


def test_train_command_and_data_dir(capsys):
    assert _dry_run(capsys, "train", *TARGET, *RUN) == [TRAIN]
    line = _dry_run(
        capsys,
        "train",
        *TARGET,
        *RUN,
        "--config",
        "tiny_lm",
        "--set",
        "task.dataset=text_files",
        "--data-dir",
        "gs://my-bucket/data/txt",
    )[0]
    assert "--set task.data_dir=gs://my-bucket/data/txt >>" in line
    # The command the VM runs, resolved as concise-train itself resolves it: its own parser, then the config.
    from concise_attention.training.run import configs

    remote = shlex.split(shlex.split(line)[-1].removeprefix("--command="))
    loop = shlex.split(remote[remote.index("-c") + 1])  # the detached bash loop
    start = next(index for index, word in enumerate(loop) if word == "concise-train" and loop[index + 1] == "--config")
    argv = loop[start + 1 : loop.index(">>", start)]
    parser = argparse.ArgumentParser()
    configs.add_config_arguments(parser)
    for flag in ("--run-dir", "--strategy", "--tpu"):
        parser.add_argument(flag)
    args = parser.parse_args(argv)
    config = configs.load_config(args.config, args.set)
    assert (config.task.data_dir, config.task.dataset, config.training.train_steps) == (
        "gs://my-bucket/data/txt",
        "text_files",
        200,
    )


def test_remote_command_quoting_survives_awkward_overrides(capsys):
    """Values with spaces and quotes reach concise-train as single, intact arguments."""
    awkward = "training.vocabulary=my vocab's file.txt"
    line = _dry_run(
        capsys, "train", *TARGET, "--run-dir", "gs://my-bucket/runs/lm", "--config", "tiny_lm", "--set", awkward
    )[0]
    remote = shlex.split(line)[-1].removeprefix("--command=")
    loop = shlex.split(remote.split("bash -c ", 1)[1])[0]  # what the worker's bash -c receives
    train = next(part for part in loop.split("; ") if part.startswith("concise-train"))
    assert shlex.split(train.split(" >>")[0])[-2:] == ["--set", awkward]


def test_supervise_plan(capsys):
    lines = _dry_run(capsys, "supervise", *TARGET, *RUN, "--poll-interval", "60", "--max-retries", "3")
    assert lines == [
        "# once:",
        "gcloud storage ls gs://my-bucket/runs/lm/launcher/concise-attention.tar.gz",
        "# if that found no staged package:",
        *STAGE,
        "# every 60 s:",
        "gcloud compute tpus tpu-vm describe lm-tpu --zone=us-central2-b '--format=value(state)'",
        "gcloud storage cat gs://my-bucket/runs/lm/launcher/status",
        "# when FAILED or NOT_FOUND or PREEMPTED or SUSPENDED or TERMINATED (at most 3 times):",
        "gcloud compute tpus tpu-vm delete lm-tpu --zone=us-central2-b --quiet",
        "gcloud compute tpus tpu-vm create lm-tpu --zone=us-central2-b --accelerator-type=v4-8 --version=tpu-ubuntu2204-base",
        "# when the VM is up and not training:",
        INSTALL,
        TRAIN,
    ]


def test_logs_tensorboard_upload_status_delete(capsys, tmp_path):
    assert _dry_run(capsys, "logs", *TARGET) == [
        "gcloud compute tpus tpu-vm ssh lm-tpu --zone=us-central2-b --worker=0 "
        "'--command=tail -n 100 -F \"$HOME/concise-train.log\"'"
    ]
    assert _dry_run(capsys, "logs", *TARGET, "--worker", "all", "--lines", "20", "--no-follow") == [
        "gcloud compute tpus tpu-vm ssh lm-tpu --zone=us-central2-b --worker=all "
        "'--command=tail -n 20 \"$HOME/concise-train.log\"'"
    ]
    assert _dry_run(capsys, "logs", *TARGET, "--saved", "--run-dir", "gs://my-bucket/runs/lm") == [
        "gcloud storage cat 'gs://my-bucket/runs/lm/launcher/*.log'"
    ]
    assert _dry_run(capsys, "tensorboard", "--run-dir", "gs://my-bucket/runs/lm/") == [
        "tensorboard --logdir=gs://my-bucket/runs/lm/logs --port=6006"
    ]
    assert _dry_run(capsys, "upload-data", "--source", str(tmp_path), "--data-dir", "gs://my-bucket/data/txt") == [
        f"gcloud storage rsync --recursive {tmp_path} gs://my-bucket/data/txt"
    ]
    assert _dry_run(capsys, "status", *TARGET, "--queued", "--run-dir", "gs://my-bucket/runs/lm") == [
        "gcloud compute tpus queued-resources describe lm-tpu-qr --zone=us-central2-b '--format=value(state.state)'",
        "gcloud storage cat gs://my-bucket/runs/lm/launcher/status",
    ]
    assert _dry_run(capsys, "delete", *TARGET) == [
        "gcloud compute tpus tpu-vm delete lm-tpu --zone=us-central2-b --quiet"
    ]
    assert _dry_run(capsys, "delete", *TARGET, "--queued") == [
        "gcloud compute tpus queued-resources delete lm-tpu-qr --zone=us-central2-b --force --quiet"
    ]


# Bad options: exit 2, one line naming the option and the value, no traceback ---------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["create", "--zone", "uscentral", "--name", "lm-tpu"], "--zone='uscentral'"),
        (["create", "--zone", "us-central2-b", "--name", "LM_TPU"], "--name='LM_TPU'"),
        (["create", *TARGET, "--accelerator-type", "tpu8"], "--accelerator-type='tpu8'"),
        (["create", *TARGET, "--spot", "--preemptible"], "--spot --preemptible"),
        (["create", *TARGET, "--queued", "--preemptible"], "--queued --preemptible"),
        (["create", *TARGET, "--project", "X"], "--project='X'"),
        (["train", *TARGET, "--run-dir", "/tmp/runs/lm", "--config", "tiny_lm"], "--run-dir='/tmp/runs/lm'"),
        (
            ["train", *TARGET, "--run-dir", "gs://my-bucket/r", "--config", "no_such_preset"],
            "--config='no_such_preset'",
        ),
        (
            ["train", *TARGET, "--run-dir", "gs://my-bucket/r", "--config", "configs/tiny_lm.yaml"],
            "--config='configs/tiny_lm.yaml'",
        ),
        (["train", *TARGET, "--run-dir", "gs://my-bucket/r", "--config", "tiny_lm", "--set", "steps"], "--set='steps'"),
        (
            ["train", *TARGET, "--run-dir", "gs://my-bucket/r", "--config", "tiny_lm", "--data-dir", "data/"],
            "--data-dir='data/'",
        ),
        (["supervise", *TARGET, *RUN, "--poll-interval", "0"], "--poll-interval=0"),
        (["supervise", *TARGET, *RUN, "--max-retries", "-1"], "--max-retries=-1"),
        (["install", *TARGET], "--run-dir"),
        (["logs", *TARGET, "--saved"], "--run-dir"),
        (["logs", *TARGET, "--worker", "first"], "--worker='first'"),
        (["tensorboard", "--run-dir", "gs://my-bucket/r", "--port", "70000"], "--port=70000"),
        (
            ["upload-data", "--source", "/no/such/folder", "--data-dir", "gs://my-bucket/d"],
            "--source='/no/such/folder'",
        ),
        (["create", "--name", "lm-tpu"], "--zone"),
        (["train", *TARGET, "--config", "tiny_lm"], "--run-dir"),
    ],
)
def test_bad_options_exit_2_naming_the_option(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        cloud_tpu.main([*argv, "--dry-run"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


# The supervisor ------------------------------------------------------------------------------


class FakeCloud:
    """Answers `describe` and `storage cat status` from scripted sequences; records everything else."""

    def __init__(self, states, statuses, failing=()):
        self.states, self.statuses, self.failing = list(states), list(statuses), failing
        self.commands = []
        self.dry = False

    def run(self, argv, capture=False):
        line = shlex.join(argv)
        self.commands.append(line)
        if "describe" in argv:
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            if state in ("NOT_FOUND", "FLAKY"):
                message = (
                    "ERROR: (gcloud) NOT_FOUND: node does not exist"
                    if state == "NOT_FOUND"
                    else "ERROR: connection reset"
                )
                return subprocess.CompletedProcess(argv, 1, "", message)
            return subprocess.CompletedProcess(argv, 0, state + "\n", "")
        if argv[1:3] == ["storage", "cat"]:
            status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            if status is None:
                return subprocess.CompletedProcess(argv, 1, "", "ERROR: The following URLs matched no objects or files")
            return subprocess.CompletedProcess(argv, 0, status + "\n", "")
        failed = any(word in line for word in self.failing)
        return subprocess.CompletedProcess(argv, 1 if failed else 0, "", "")

    def count(self, fragment):
        return sum(fragment in line for line in self.commands)


def _supervise(cloud, *extra):
    sleeps = []
    code = cloud_tpu.main(
        ["supervise", *TARGET, *RUN, "--package", "pkg==1", "--poll-interval", "7", *extra],
        runner=cloud,
        sleep=sleeps.append,
    )
    return code, sleeps


@pytest.mark.parametrize(
    "state, status, launched, action",
    [
        ("READY", "running", True, "wait"),
        ("READY", None, True, "launch"),
        ("READY", "running", False, "launch"),
        ("CREATING", "running", False, "wait"),
        ("PREEMPTED", "running", True, "recreate"),
        ("TERMINATED", "running", True, "recreate"),
        ("NOT_FOUND", None, True, "recreate"),
        ("SUSPENDED", "running", True, "recreate"),
        ("WAITING_FOR_RESOURCES", "running", False, "wait"),
        ("UNKNOWN", "running", True, "wait"),
        ("READY", "unknown", True, "wait"),
        ("READY", "0", True, "done"),
        ("PREEMPTED", "0", True, "done"),
        ("READY", "1", True, "failed"),
        ("READY", "75", True, "failed"),
    ],
)
def test_decide(state, status, launched, action):
    assert cloud_tpu.decide(state, status, launched) == action


def test_one_preemption_means_one_recreation(capsys):
    cloud = FakeCloud(["READY", "PREEMPTED", "READY", "READY"], ["running", "running", "running", "0"])
    code, sleeps = _supervise(cloud)
    assert code == 0
    assert cloud.count("tpu-vm delete") == 1 and cloud.count("tpu-vm create") == 1
    assert cloud.count("pip install") == 1 and cloud.count("setsid nohup") == 1
    assert cloud.commands.index(next(c for c in cloud.commands if "tpu-vm create" in c)) < cloud.commands.index(
        next(c for c in cloud.commands if "setsid nohup" in c)
    )
    assert sleeps == [7, 7]  # no wait between creating the VM and launching on it
    assert "PREEMPTED" in capsys.readouterr().out


def test_recreations_are_bounded(capsys):
    cloud = FakeCloud(["PREEMPTED"], ["running"])
    code, _ = _supervise(cloud, "--max-retries", "2")
    assert code == 1
    assert cloud.count("tpu-vm create") == 2 and cloud.count("pip install") == 0  # never up long enough to launch
    assert "giving up" in capsys.readouterr().out


def test_failed_launches_are_bounded(capsys):
    cloud = FakeCloud(["READY"], [None], failing=("pip install",))
    code, sleeps = _supervise(cloud, "--max-retries", "2")
    assert code == 1 and cloud.count("pip install") == 3 and cloud.count("tpu-vm create") == 0
    assert sleeps == [7, 7]


def test_a_failed_run_is_not_recreated(capsys):
    cloud = FakeCloud(["READY"], ["1"])
    assert _supervise(cloud)[0] == 1
    assert cloud.count("create") == 0 and cloud.count("ssh") == 0


def test_an_unreadable_state_is_not_a_preemption(capsys):
    cloud = FakeCloud(["FLAKY", "READY"], ["running", "0"])
    assert _supervise(cloud)[0] == 0
    assert cloud.count("delete") == 0 and cloud.count("create") == 0


def test_a_missing_vm_is_created_and_launched(capsys):
    cloud = FakeCloud(["NOT_FOUND", "READY"], [None, None, "running", "0"])
    assert _supervise(cloud)[0] == 0
    assert cloud.count("tpu-vm create") == 1 and cloud.count("setsid nohup") == 1


@pytest.mark.parametrize("staged", [True, False])
def test_the_checkout_is_staged_only_when_the_run_has_none(capsys, staged):
    cloud = FakeCloud(["READY"], ["0"], failing=() if staged else ("storage ls",))
    assert cloud_tpu.main(["supervise", *TARGET, *RUN], runner=cloud, sleep=lambda seconds: None) == 0
    assert cloud.commands[0] == "gcloud storage ls gs://my-bucket/runs/lm/launcher/concise-attention.tar.gz"
    assert (cloud.commands[1:4] == STAGE) is not staged


def test_a_queued_resource_is_polled_until_active(capsys):
    cloud = FakeCloud(
        ["SUSPENDED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "ACTIVE"],
        ["running", "running", "running", "running", "0"],
    )
    assert _supervise(cloud, "--queued")[0] == 0
    assert (
        cloud.count("queued-resources delete lm-tpu-qr") == 1 and cloud.count("queued-resources create lm-tpu-qr") == 1
    )
    assert cloud.count("setsid nohup") == 1


def test_status_prints_the_vm_state_and_the_run_status(capsys):
    cloud = FakeCloud(["READY"], [None])
    assert cloud_tpu.main(["status", *TARGET, "--run-dir", "gs://my-bucket/runs/lm"], runner=cloud) == 0
    assert capsys.readouterr().out.splitlines() == ["lm-tpu: READY", "gs://my-bucket/runs/lm: not started"]


def test_a_failing_command_reports_its_exit_code(capsys):
    cloud = FakeCloud(["READY"], ["running"], failing=("tpu-vm create",))
    assert cloud_tpu.main(["create", *TARGET], runner=cloud) == 1
    assert "exit code 1: gcloud compute tpus tpu-vm create lm-tpu" in capsys.readouterr().err


# The remote bash, run here with fake gcloud and concise-train ------------------------------

FAKE_GCLOUD = """#!/bin/bash
# gcloud storage cp SRC DST, with gs://X stored under $FAKE_GCS/X and '-' meaning stdin
[ "$1 $2" = "storage cp" ] || exit 3
local_path() { case "$1" in gs://*) echo "$FAKE_GCS/${1#gs://}";; *) echo "$1";; esac; }
destination=$(local_path "$4")
mkdir -p "$(dirname "$destination")"
if [ "$3" = - ]; then cat > "$destination"; else cp "$(local_path "$3")" "$destination"; fi
"""
FAKE_TRAIN = """#!/bin/bash
# exits with the next code listed in $HOME/codes (0 when they run out), after $HOME/delay seconds
echo "$*" >> "$HOME/calls"
call=$(wc -l < "$HOME/calls")
/usr/bin/sleep "$(cat "$HOME/delay" 2>/dev/null || echo 0)"
code=$(sed -n "${call}p" "$HOME/codes")
echo "training, call $call"
exit "${code:-0}"
"""
FAKE_SLEEP = """#!/bin/bash
# the loop's 10 s pause between restarts is skipped; the log copier naps briefly
[ "$1" = 10 ] || exec /usr/bin/sleep 0.2
"""


@pytest.fixture
def fake_vm(tmp_path):
    home, tools, bucket = tmp_path / "home", tmp_path / "bin", tmp_path / "gcs"
    for folder in (home, tools, bucket):
        folder.mkdir()
    for name, text in (("gcloud", FAKE_GCLOUD), ("concise-train", FAKE_TRAIN), ("sleep", FAKE_SLEEP)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{tools}:/usr/bin:/bin", "FAKE_GCS": str(bucket)}
    launcher = bucket / "my-bucket" / "runs" / "lm" / "launcher"
    return home, env, launcher


def _options(max_restarts=100):
    return cloud_tpu.Options(
        zone="us-central2-b",
        name="lm-tpu",
        run_dir="gs://my-bucket/runs/lm",
        config="tiny_lm",
        overrides=("training.train_steps=200",),
        max_restarts=max_restarts,
    )


@pytest.mark.parametrize(
    "codes, max_restarts, calls, status",
    [
        ([75, 75, 0], 100, 3, "0"),  # restarted after each 75, finished
        ([1, 0], 100, 1, "1"),  # a crash is not restarted on the VM
        ([75, 75, 75, 75], 2, 3, "75"),  # restarts are bounded
    ],
)
def test_restart_loop(fake_vm, codes, max_restarts, calls, status):
    home, env, launcher = fake_vm
    (home / "codes").write_text("".join(f"{code}\n" for code in codes))
    subprocess.run(
        ["bash", "-c", cloud_tpu.training_loop(_options(max_restarts))],
        env=env,
        check=True,
        timeout=60,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lines = (home / "calls").read_text().splitlines()
    assert (
        lines
        == [
            "--config tiny_lm --run-dir gs://my-bucket/runs/lm --strategy tpu --tpu local "
            "--set training.train_steps=200"
        ]
        * calls
    )
    assert (launcher / "status").read_text().strip() == status
    saved_log = (launcher / f"{os.uname().nodename}.log").read_text()
    assert saved_log.count("training, call") == calls and f"exit code {codes[calls - 1]}" in saved_log


def _wait_for_the_loop(launcher, seconds=30):
    """The status the loop leaves (the fake gcloud truncates, then writes: an empty read is mid-write)."""
    deadline = time.monotonic() + seconds
    while (status := (launcher / "status").read_text().strip()) in ("running", "") and time.monotonic() < deadline:
        time.sleep(0.1)
    return status


def test_train_detaches_and_refuses_a_second_launch(fake_vm):
    """The first launch returns while training runs; a second one at once is refused (the lock is
    taken before the first returns, not by its detached child later); once the loop has ended the
    lock is free and a new launch starts."""
    home, env, launcher = fake_vm
    (home / "codes").write_text("0\n0\n")
    (home / "delay").write_text("4\n")
    remote = cloud_tpu.train_command(_options())[-1].removeprefix("--command=")
    started = time.monotonic()
    subprocess.run(["bash", "-c", remote], env=env, check=True, timeout=30)
    assert time.monotonic() - started < 3  # returned while concise-train still runs
    assert (launcher / "status").read_text().strip() == "running"
    second = subprocess.run(["bash", "-c", remote], env=env, capture_output=True, text=True, timeout=30)
    assert second.returncode == 1 and "already running" in second.stderr
    assert _wait_for_the_loop(launcher) == "0"
    assert (home / "calls").read_text().count("--tpu local") == 1
    (home / "delay").write_text("0\n")
    # The loop writes its status last and releases the lock as it exits, a moment later.
    subprocess.run(["flock", "-w", "10", str(home / ".concise-train.lock"), "true"], check=True, timeout=30)
    subprocess.run(["bash", "-c", remote], env=env, check=True, timeout=30)
    assert _wait_for_the_loop(launcher) == "0"
    assert (home / "calls").read_text().count("--tpu local") == 2


def test_gpu_heads_study_presets_train_from_the_shards_it_prepares():
    """scripts/gpu_heads_study.sh (not run here: no GPU): every preset it trains reads the shards
    its `prepare` step writes (causal_lm, same sequence length, a vocabulary that fits), and a
    bad command line is refused with exit 2."""
    from concise_attention.training.run import configs

    script = ROOT / "scripts" / "gpu_heads_study.sh"
    text = script.read_text()
    presets = text.split("PRESETS=(", 1)[1].split(")", 1)[0].split()
    assert len(presets) == 6 and any("fixed" in p for p in presets) and any("standard" in p for p in presets)
    prepared = configs.load_config("lm1b_standard_d256", ["task.dataset=text_files", "task.data_dir=corpus"])
    for preset in presets:
        config = configs.load_config(preset, ["training.train_steps=20000", "tokenizer.vocabulary=prepared/vocab.txt"])
        assert config.task.name == "causal_lm"
        assert config.training.sequence_length == prepared.training.sequence_length
        assert config.model.vocab_size >= prepared.model.vocab_size
    for argv in ([], ["train", "p", "r", "0"], ["prepare", "only-one"]):
        result = subprocess.run(["bash", str(script), *argv], capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.startswith("usage:"), (argv, result)


def _prepared_folder(path, train_shards, rows=5, length=8, seed=0):
    """A prepared causal_lm folder in the format training/data/shards.py documents, written by hand."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed)
    path.mkdir()
    (path / "vocab.txt").write_text("[PAD]\n" + "".join(f"w{index}\n" for index in range(40000)))
    splits = {}
    for split, count in (("train", train_shards), ("eval", 1)):
        listed = []
        for index in range(count):
            segments = np.sort(rng.integers(0, 3, size=(rows, length)), axis=1)
            tokens = np.where(segments > 0, rng.integers(1, 40000, size=(rows, length)), 0)
            positions = np.where(segments > 0, rng.integers(0, length, size=(rows, length)), 0)
            name = f"{split}-{index:05d}.npy"
            np.save(path / name, np.stack([tokens, segments, positions], axis=1).astype(np.int32))
            listed.append({"file": name, "rows": rows})
        splits[split] = {"shards": listed, "rows": rows * count, "lines": 3 * count, "tokens": 0}
    manifest = {
        "format": "concise-prepared-data/1",
        "task": "causal_lm",
        "fields": ["token_ids", "segment_ids", "positions"],
        "sequence_length": length,
        "splits": splits,
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_prepared_archive_rebuilds_the_shards_byte_for_byte_and_refuses_a_changed_one(tmp_path):
    """scripts/prepared_archive.py: pack keeps the first N training shards, unpack rebuilds each one
    identical to its file (int32, numpy's format) from the compact fields, the manifest lists the
    subset with its tokens counted independently here, and a shard that does not rebuild to the
    packed hash is refused with exit 2 before the manifest is written."""
    import io
    import json
    import tarfile

    import numpy as np

    script = [sys.executable, str(ROOT / "scripts" / "prepared_archive.py")]
    _prepared_folder(tmp_path / "prepared", train_shards=3)
    archive, out = tmp_path / "data.tar.xz", tmp_path / "out"
    subprocess.run([*script, "pack", str(tmp_path / "prepared"), str(archive), "--train-shards", "2"], check=True)
    subprocess.run([*script, "unpack", str(archive), str(out)], check=True)
    assert sorted(path.name for path in out.iterdir()) == [
        "eval-00000.npy",
        "manifest.json",
        "train-00000.npy",
        "train-00001.npy",
        "vocab.txt",
    ]
    for name in ("eval-00000.npy", "train-00000.npy", "train-00001.npy", "vocab.txt"):
        assert (out / name).read_bytes() == (tmp_path / "prepared" / name).read_bytes(), name
    train = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    kept = [np.load(tmp_path / "prepared" / f"train-0000{index}.npy") for index in (0, 1)]
    assert [shard["file"] for shard in train["shards"]] == ["train-00000.npy", "train-00001.npy"]
    assert train["rows"] == 10 and train["tokens"] == sum(int((rows[:, 1] != 0).sum()) for rows in kept)
    assert train["subset_of"] == {"rows": 15, "lines": 9, "tokens": 0, "shards": 3}

    changed = tmp_path / "changed.tar.xz"  # the same archive with one token id altered
    with tarfile.open(archive, "r:xz") as source, tarfile.open(changed, "w:xz") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == "train-00001.npy.token_ids.npy":
                values = np.load(io.BytesIO(data))
                values[0, 0] += 1
                buffer = io.BytesIO()
                np.save(buffer, values)
                data = buffer.getvalue()
                member.size = len(data)
            target.addfile(member, io.BytesIO(data))
    result = subprocess.run(
        [*script, "unpack", str(changed), str(tmp_path / "refused")], capture_output=True, text=True
    )
    assert result.returncode == 2 and "train-00001.npy does not rebuild" in result.stderr, result.stderr
    assert not (tmp_path / "refused" / "manifest.json").exists()


def test_gpu_heads_study_collect_reads_finished_runs_and_the_last_checkpoint_of_stopped_ones(tmp_path):
    """`gpu_heads_study.sh collect`: a finished run contributes its metrics.json, a run stopped by
    TRAIN_SECONDS the epoch logs inside its last checkpoint (the shard trainer's state.npz)."""
    import json

    import numpy as np

    runs = tmp_path / "runs"
    finished, stopped = runs / "lm1b_standard_d256", runs / "lm1b_fixed_d256_p32_h70"
    for run in (finished, stopped):
        (run / "checkpoint").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"name": run.name}))
    (finished / "metrics.json").write_text(json.dumps({"step": 600, "eval_loss": 4.0}))
    history = [{"epoch": 1, "step": 300, "val_loss": 5.9}, {"epoch": 2, "step": 600, "val_loss": 5.1}]
    np.savez(stopped / "checkpoint" / "state.npz", model_0=np.zeros(3), history=np.asarray(json.dumps(history)))
    (runs / "lm1b_standard_d256.log").write_text("not a run")
    script = ROOT / "scripts" / "gpu_heads_study.sh"
    subprocess.run(
        ["bash", str(script), "collect", str(runs), str(tmp_path / "study.json")], check=True, capture_output=True
    )
    study = json.loads((tmp_path / "study.json").read_text())
    assert sorted(study) == ["lm1b_fixed_d256_p32_h70", "lm1b_standard_d256"]
    assert study["lm1b_standard_d256"] == {
        "config": {"name": "lm1b_standard_d256"},
        "metrics": {"step": 600, "eval_loss": 4.0},
    }
    assert study["lm1b_fixed_d256_p32_h70"]["history"] == history
    assert [path.name for path in tmp_path.iterdir() if ".tmp-" in path.name] == []
    assert not (tmp_path / "provenance.json").exists()  # none recorded: none invented
    _check_provenance(script, runs, tmp_path)
    assert sorted(json.loads((tmp_path / "study.json").read_text())) == sorted(study)  # not a run


def _check_provenance(script, runs, tmp_path):
    """`train` records the code first (`provenance`): this checkout's git, or the launcher's STUDY_COMMIT in a copy
    without .git; a later commit is added, not swapped in; `collect` puts it beside the study (or removes another's)."""
    import json
    import shutil

    def provenance(folder, script=script, **env):
        return subprocess.run(
            ["bash", str(script), "provenance", str(folder)], capture_output=True, text=True, env={**os.environ, **env}
        )

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    other = "0123456789abcdef0123456789abcdef01234567"
    assert provenance(runs, STUDY_COMMIT=other).returncode == 0  # a git checkout: its own commit wins
    assert json.loads((runs / "provenance.json").read_text())["commit"] == head
    copy = tmp_path / "copy" / "scripts" / script.name  # the tree as a lent machine gets it: no .git
    for path in (script, ROOT / "benchmarks" / "provenance.py"):
        (tmp_path / "copy" / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / "copy" / path.relative_to(ROOT))
    refused = provenance(runs, copy, STUDY_COMMIT="abc")
    assert refused.returncode == 2 and "STUDY_COMMIT='abc'" in refused.stderr
    assert provenance(runs, copy, STUDY_COMMIT=other, STUDY_CLEAN="true").returncode == 0  # resumed from other code
    record = json.loads((runs / "provenance.json").read_text())
    assert (record["commit"], [(later["commit"], later["clean"]) for later in record["later"]]) == (
        head,
        [(other, "true")],
    )
    subprocess.run(
        ["bash", str(script), "collect", str(runs), str(tmp_path / "study.json")], check=True, capture_output=True
    )
    assert json.loads((tmp_path / "provenance.json").read_text()) == record
    (runs / "provenance.json").unlink()
    subprocess.run(
        ["bash", str(script), "collect", str(runs), str(tmp_path / "study.json")], check=True, capture_output=True
    )
    assert not (tmp_path / "provenance.json").exists()
