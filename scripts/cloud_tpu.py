"""Cloud TPU launcher: create a TPU VM, install this package, train on gs://, survive preemption, tear down.

One entry point, one validated options object, every gcloud call built as an argument list:

    python scripts/cloud_tpu.py up --zone us-central2-b --name lm1b-tpu --spot \\
        --run-dir gs://my-bucket/runs/lm1b_fixed --config lm1b_fixed_d256_p32_h8
    python scripts/cloud_tpu.py supervise ...same options...   # recreates the VM after preemption
    python scripts/cloud_tpu.py logs --zone us-central2-b --name lm1b-tpu
    python scripts/cloud_tpu.py delete --zone us-central2-b --name lm1b-tpu

`--dry-run` on any subcommand prints the exact commands, one per line, and runs nothing.

On the VM, `concise-train` runs detached (setsid nohup) in a loop that starts it again when it
exits with 75 (it saved a checkpoint on SIGTERM), so a maintenance notice costs a restart, not the
run. When the VM itself is preempted, `supervise` (on your machine) deletes and recreates it,
installs the staged package again and relaunches; the run resumes from its checkpoint in gs://.
The loop records its final exit code in RUN_DIR/launcher/status ("running" while it runs), which is
how `supervise` knows a run has finished or failed for a reason a new VM would not fix.

Standard library only: it runs on a laptop that has gcloud and nothing of this package installed.
"""

import argparse
import dataclasses
import datetime
import pathlib
import re
import shlex
import subprocess
import sys
import time
import typing

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROG = "cloud_tpu.py"
RESTART_EXIT_CODE = 75  # EX_TEMPFAIL: concise-train saved a checkpoint on SIGTERM and asks to be run again
STAGED_PACKAGE = "concise-attention.tar.gz"
REMOTE_LOG = "$HOME/concise-train.log"
REMOTE_LOCK = "$HOME/.concise-train.lock"

# Software images for TPU VMs (cloud.google.com/tpu/docs/runtimes): TensorFlow 2.20 has no tpu-vm-tf
# image of its own there, so the base Ubuntu image of each generation gets `tensorflow-tpu` from PyPI.
BASE_RUNTIMES = {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
DEFAULT_RUNTIME = "tpu-ubuntu2204-base"  # v2, v3, v4

# `describe --format=value(state)` of a TPU VM, and `value(state.state)` of a queued resource.
RUNNING_STATES = frozenset({"READY", "ACTIVE"})
LOST_STATES = frozenset({"PREEMPTED", "TERMINATED", "NOT_FOUND", "SUSPENDED", "FAILED"})

_PATTERNS = {
    "project": (r"([a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", "a project id such as my-project"),
    "zone": (r"[a-z]+-[a-z]+[0-9]+-[a-z]", "a zone such as us-central2-b"),
    "name": (
        r"[a-z]([-a-z0-9]{0,58}[a-z0-9])?",
        "lower-case letters, digits and hyphens, starting with a letter, at most 60",
    ),
    "accelerator_type": (r"v[0-9]+[a-z]*-[0-9]+", "an accelerator type such as v4-8, v5litepod-8 or v6e-8"),
    "runtime_version": (r"[a-z0-9][-a-z0-9._]*", "a TPU software version such as tpu-ubuntu2204-base"),
    "run_dir": (r"gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/[^\s]*)?", "a gs://BUCKET/PATH the TPU workers can reach"),
    "data_dir": (r"gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/[^\s]*)?", "a gs://BUCKET/PATH the TPU workers can reach"),
    "config": (r"[A-Za-z0-9_]+", "a preset name (the file name in configs/ without .yaml)"),
}
_OVERRIDE = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+=.*", re.S)


def _flag(field):
    return "--" + field.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything the subcommands need; validated once, on construction.

    A field left None is one the chosen subcommand does not use (argparse marks the ones it needs
    as required). Errors name the command-line option and the value received.
    """

    zone: typing.Optional[str] = None
    name: typing.Optional[str] = None
    project: typing.Optional[str] = None
    queued: bool = False
    accelerator_type: str = "v4-8"
    runtime_version: typing.Optional[str] = None
    spot: bool = False
    preemptible: bool = False
    run_dir: typing.Optional[str] = None
    config: typing.Optional[str] = None
    overrides: tuple = ()
    data_dir: typing.Optional[str] = None
    package: str = "checkout"
    tf_package: str = "tensorflow-tpu==2.20.0"
    max_restarts: int = 100
    poll_interval: int = 300
    max_retries: int = 20
    worker: str = "0"
    lines: int = 100
    follow: bool = True
    saved: bool = False
    port: int = 6006
    source: typing.Optional[str] = None

    def __post_init__(self):
        for field, (pattern, meaning) in _PATTERNS.items():
            value = getattr(self, field)
            if value is not None and not re.fullmatch(pattern, value):
                raise ValueError(f"{_flag(field)} must be {meaning}. Received: {_flag(field)}={value!r}")
        for text in self.overrides:
            if not _OVERRIDE.fullmatch(text):
                raise ValueError(
                    f"--set must look like section.key=value, e.g. training.train_steps=1000. Received: --set={text!r}"
                )
        if (
            self.config is not None
            and (ROOT / "configs").is_dir()
            and not (ROOT / "configs" / f"{self.config}.yaml").is_file()
        ):
            presets = sorted(path.stem for path in (ROOT / "configs").glob("*.yaml"))
            raise ValueError(
                f"--config must name a preset in configs/ ({', '.join(presets)}). Received: --config={self.config!r}"
            )
        for field, minimum in (("max_restarts", 0), ("poll_interval", 1), ("max_retries", 0), ("lines", 1)):
            if getattr(self, field) < minimum:
                raise ValueError(
                    f"{_flag(field)} must be an integer >= {minimum}. Received: {_flag(field)}={getattr(self, field)!r}"
                )
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be in 1..65535. Received: --port={self.port!r}")
        if not re.fullmatch(r"all|[0-9]+", self.worker):
            raise ValueError(f"--worker must be a worker index or 'all'. Received: --worker={self.worker!r}")
        if self.spot and self.preemptible:
            raise ValueError("--spot and --preemptible exclude each other. Received: --spot --preemptible")
        if self.preemptible and self.queued:
            raise ValueError("queued resources take --spot, not --preemptible. Received: --queued --preemptible")
        for field in ("package", "tf_package"):
            if not getattr(self, field).strip():
                raise ValueError(
                    f"{_flag(field)} must be a pip requirement. Received: {_flag(field)}={getattr(self, field)!r}"
                )
        if self.source is not None and not pathlib.Path(self.source).is_dir():
            raise ValueError(f"--source must be a local folder. Received: --source={self.source!r}")

    @property
    def runtime(self):
        """The TPU software version: the one given, else the base image of the accelerator's generation."""
        return self.runtime_version or BASE_RUNTIMES.get(self.accelerator_type.split("-")[0], DEFAULT_RUNTIME)

    @property
    def queued_resource(self):
        return f"{self.name}-qr"

    @property
    def launcher_dir(self):
        """Where the launcher keeps its files beside the run: staged package, status, log copies."""
        return f"{self.run_dir.rstrip('/')}/launcher"


# ---------------------------------------------------------------------------------------------
# Commands (argument lists; only the remote --command is a shell string, built with shlex.quote)


def _gcloud(options, *args):
    return ["gcloud", *args, *([f"--project={options.project}"] if options.project else [])]


def _ssh(options, remote_command, worker="all"):
    return _gcloud(
        options,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        options.name,
        f"--zone={options.zone}",
        f"--worker={worker}",
        f"--command={remote_command}",
    )


def create_commands(options):
    """Creates the TPU VM, directly or as a queued resource (which waits for capacity)."""
    provisioning = ["--spot"] if options.spot else ["--preemptible"] if options.preemptible else []
    if options.queued:
        return [
            _gcloud(
                options,
                "compute",
                "tpus",
                "queued-resources",
                "create",
                options.queued_resource,
                f"--node-id={options.name}",
                f"--zone={options.zone}",
                f"--accelerator-type={options.accelerator_type}",
                f"--runtime-version={options.runtime}",
                *provisioning,
            )
        ]
    return [
        _gcloud(
            options,
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            options.name,
            f"--zone={options.zone}",
            f"--accelerator-type={options.accelerator_type}",
            f"--version={options.runtime}",
            *provisioning,
        )
    ]


def delete_commands(options):
    if options.queued:
        return [
            _gcloud(
                options,
                "compute",
                "tpus",
                "queued-resources",
                "delete",
                options.queued_resource,
                f"--zone={options.zone}",
                "--force",
                "--quiet",
            )
        ]
    return [_gcloud(options, "compute", "tpus", "tpu-vm", "delete", options.name, f"--zone={options.zone}", "--quiet")]


def stage_commands(options):
    """Packs the committed HEAD of this checkout and puts it beside the run, so every VM (also a
    recreated one) installs the same code."""
    if options.package != "checkout":
        return []
    if not options.run_dir:
        raise ValueError("--package checkout is staged in the run directory: give --run-dir gs://BUCKET/PATH")
    tarball = str(ROOT / "dist" / STAGED_PACKAGE)
    return [
        ["mkdir", "-p", str(ROOT / "dist")],
        ["git", "-C", str(ROOT), "archive", "--format=tar.gz", "--prefix=concise-attention/", "-o", tarball, "HEAD"],
        _gcloud(options, "storage", "cp", tarball, f"{options.launcher_dir}/{STAGED_PACKAGE}"),
    ]


def staged_package_command(options):
    """Lists the staged package: fails when it is absent."""
    return _gcloud(options, "storage", "ls", f"{options.launcher_dir}/{STAGED_PACKAGE}")


def install_command(options):
    """pip-installs the package on every worker, then swaps `tensorflow` for the TPU build.

    The package depends on `tensorflow`; `tensorflow-tpu` ships the same modules built for TPUs.
    Both own tensorflow/, so the TPU build is installed last and forced, which also makes a second
    install on the same VM come out right.
    """
    pip = "python3 -m pip"
    steps = [f"{pip} install --upgrade pip"]
    if options.package == "checkout":
        local = f"$HOME/{STAGED_PACKAGE}"
        steps = [
            f'gcloud storage cp {shlex.quote(f"{options.launcher_dir}/{STAGED_PACKAGE}")} "{local}"',
            *steps,
            f'{pip} install "{local}"',
        ]
    else:
        steps.append(f"{pip} install {shlex.quote(options.package)}")
    if options.tf_package != "none":
        tf_package = shlex.quote(options.tf_package)
        steps += [
            f"{pip} uninstall -y tensorflow",
            f"{pip} install {tf_package}",
            f"{pip} install --force-reinstall --no-deps {tf_package}",
        ]
    return _ssh(options, " && ".join(steps))


def training_loop(options):
    """The bash loop each worker runs detached: concise-train again after exit code 75, bounded.

    Its log lives on the VM and is copied to RUN_DIR/launcher/ every 5 minutes and at the end (a
    preempted VM takes its disk with it); the final exit code goes to RUN_DIR/launcher/status.
    """
    overrides = [*options.overrides, *([f"task.data_dir={options.data_dir}"] if options.data_dir else [])]
    train = shlex.join(
        [
            "concise-train",
            "--config",
            options.config,
            "--run-dir",
            options.run_dir.rstrip("/"),
            "--strategy",
            "tpu",
            "--tpu",
            "local",
            *[arg for text in overrides for arg in ("--set", text)],
        ]
    )
    log_copy = shlex.quote(f"{options.launcher_dir}/") + '"$(hostname).log"'
    status = shlex.quote(f"{options.launcher_dir}/status")
    return "; ".join(
        [
            'export PATH="$HOME/.local/bin:$PATH"',
            f'log="{REMOTE_LOG}"',
            f'(while sleep 300; do gcloud storage cp "$log" {log_copy}; done) 9>&- & copier=$!',
            "restarts=0",
            'while true; do echo "$(date -u +%FT%TZ) concise-train start (restart $restarts)" >> "$log"',
            f'{train} >> "$log" 2>&1',
            "code=$?",
            'echo "$(date -u +%FT%TZ) concise-train exit code $code" >> "$log"',
            f'if [ "$code" -ne {RESTART_EXIT_CODE} ] || [ "$restarts" -ge {options.max_restarts} ]; then break; fi',
            "restarts=$((restarts + 1))",
            "sleep 10",
            "done",
            'kill "$copier"',
            f'gcloud storage cp "$log" {log_copy}',
            f'echo "$code" | gcloud storage cp - {status}',
        ]
    )


def train_command(options):
    """Starts the loop on every worker, detached from ssh; refuses if one is already running there.

    The lock is taken here, before anything starts, on descriptor 9, which the detached loop inherits
    and holds until it ends (its log copier closes it), so a second launch is refused however soon
    it follows the first.
    """
    status = shlex.quote(f"{options.launcher_dir}/status")
    return _ssh(
        options,
        "; ".join(
            [
                f'exec 9>>"{REMOTE_LOCK}"',
                'if ! flock -n 9; then echo "concise-train is already running on $(hostname)" >&2; exit 1; fi',
                f"echo running | gcloud storage cp - {status} || exit 1",
                f"setsid nohup bash -c {shlex.quote(training_loop(options))} > /dev/null 2>&1 < /dev/null &",
            ]
        ),
    )


def state_command(options):
    if options.queued:
        return _gcloud(
            options,
            "compute",
            "tpus",
            "queued-resources",
            "describe",
            options.queued_resource,
            f"--zone={options.zone}",
            "--format=value(state.state)",
        )
    return _gcloud(
        options,
        "compute",
        "tpus",
        "tpu-vm",
        "describe",
        options.name,
        f"--zone={options.zone}",
        "--format=value(state)",
    )


def status_command(options):
    return _gcloud(options, "storage", "cat", f"{options.launcher_dir}/status")


def logs_command(options):
    if options.saved:
        return _gcloud(options, "storage", "cat", f"{options.launcher_dir}/*.log")
    tail = f'tail -n {options.lines} {"-F " if options.follow else ""}"{REMOTE_LOG}"'
    return _ssh(options, tail, worker=options.worker)


def tensorboard_command(options):
    return ["tensorboard", f"--logdir={options.run_dir.rstrip('/')}/logs", f"--port={options.port}"]


def upload_data_command(options):
    return _gcloud(options, "storage", "rsync", "--recursive", options.source, options.data_dir)


# ---------------------------------------------------------------------------------------------
# Running them


class CommandFailed(Exception):
    def __init__(self, argv, returncode, reason=None):
        super().__init__(f"{reason or f'command failed with exit code {returncode}'}: {shlex.join(argv)}")
        self.returncode = returncode


class Shell:
    """Runs argument lists, never through a local shell."""

    dry = False

    def run(self, argv, capture=False):
        try:
            return subprocess.run(argv, capture_output=capture, text=True, check=False)
        except FileNotFoundError as error:
            raise CommandFailed(argv, 127, f"{argv[0]} not found on PATH") from error


class DryRun:
    """Prints each command, shell-quoted, one per line, and runs nothing."""

    dry = True

    def run(self, argv, capture=False):
        print(shlex.join(argv), flush=True)
        return subprocess.CompletedProcess(argv, 0, "", "")


def run_all(runner, commands):
    for argv in commands:
        completed = runner.run(argv)
        if completed.returncode:
            raise CommandFailed(argv, completed.returncode)


# ---------------------------------------------------------------------------------------------
# Supervision: poll, and after a preemption delete, recreate, reinstall and relaunch

WAIT, LAUNCH, RECREATE, DONE, FAILED = "wait", "launch", "recreate", "done", "failed"


def decide(state, run_status, launched):
    """What the supervisor does next.

    Args:
        state: the VM's (or queued resource's) state, "NOT_FOUND", or "UNKNOWN" when it could not be read.
        run_status: RUN_DIR/launcher/status: None when absent, "unknown" when unreadable, "running",
            or the final exit code of the loop on the VM.
        launched: whether training was started on the current VM.
    """
    if run_status == "0":
        return DONE
    if run_status not in (None, "unknown", "running"):
        return FAILED  # the loop ended with a code a new VM would not change
    if state in LOST_STATES:
        return RECREATE
    if state in RUNNING_STATES and (not launched or run_status is None):
        return LAUNCH
    return WAIT


def read_state(options, runner):
    completed = runner.run(state_command(options), capture=True)
    if completed.returncode:
        return "NOT_FOUND" if re.search(r"NOT_FOUND|was not found", completed.stderr or "") else "UNKNOWN"
    return completed.stdout.strip() or "UNKNOWN"


def read_run_status(options, runner):
    completed = runner.run(status_command(options), capture=True)
    if completed.returncode:
        return None if re.search(r"matched no objects|not found|404", completed.stderr or "", re.I) else "unknown"
    return completed.stdout.strip() or "unknown"


def _log(message):
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ} {message}", flush=True)


def _recover(options, runner, action):
    """Runs one recovery step; False when a command in it failed (a later poll tries again)."""
    if action == RECREATE:
        runner.run(delete_commands(options)[0])  # fails harmlessly when the VM is already gone
        commands = create_commands(options)
    else:
        commands = [install_command(options), train_command(options)]
    try:
        run_all(runner, commands)
    except CommandFailed as error:
        _log(str(error))
        return False
    return True


def supervise(options, runner, sleep=time.sleep):
    """Keeps the run alive until it ends: returns 0 when it finished, 1 when it failed or retries ran out.

    Stages the package unless the run has one (a resumed run keeps the code it started with), then
    every `poll_interval` seconds reads the VM state and the run status. A lost VM is recreated, at
    most `max_retries` times; a VM up but not training gets the package installed and training
    launched, at most `max_retries` failures in a row.
    """
    if options.package == "checkout" and runner.run(staged_package_command(options), capture=True).returncode:
        run_all(runner, stage_commands(options))
    recreations = launch_failures = 0
    launched = True  # a VM found up with a status of "running" is left alone
    while True:
        state, run_status = read_state(options, runner), read_run_status(options, runner)
        action = decide(state, run_status, launched)
        _log(f"{options.name}: state={state} run={run_status} -> {action}")
        if action in (DONE, FAILED):
            return 0 if action == DONE else 1
        if action == RECREATE:
            if recreations == options.max_retries:
                _log(f"giving up: the VM was recreated {recreations} times (--max-retries={options.max_retries})")
                return 1
            recreations += 1
            launched = False
            if _recover(options, runner, RECREATE):
                continue  # a created TPU VM is up at once; a queued resource is polled until it is
        elif action == LAUNCH:
            launched = _recover(options, runner, LAUNCH)
            launch_failures = 0 if launched else launch_failures + 1
            if launch_failures > options.max_retries:
                _log(
                    f"giving up: launching failed {launch_failures} times in a row (--max-retries={options.max_retries})"
                )
                return 1
        sleep(options.poll_interval)


def wait_until_running(options, runner, sleep=time.sleep, interval=60):
    """Polls a queued resource until it is ACTIVE (a dry run prints the poll once)."""
    while True:
        state = read_state(options, runner)
        if state in RUNNING_STATES or runner.dry:
            return
        if state in LOST_STATES:
            raise CommandFailed(state_command(options), 1, f"{options.queued_resource} is {state}")
        _log(f"waiting for {options.queued_resource}: {state}")
        sleep(interval)


def up(options, runner, sleep=time.sleep):
    """Stages the package, creates the VM, and once it is up installs and starts training."""
    run_all(runner, [*stage_commands(options), *create_commands(options)])
    if options.queued:
        wait_until_running(options, runner, sleep)
    run_all(runner, [install_command(options), train_command(options)])


def print_supervision_plan(options, runner):
    if options.package == "checkout":
        print("# once:")
        run_all(runner, [staged_package_command(options)])
        print("# if that found no staged package:")
        run_all(runner, stage_commands(options))
    print(f"# every {options.poll_interval} s:")
    run_all(runner, [state_command(options), status_command(options)])
    print(f"# when {' or '.join(sorted(LOST_STATES))} (at most {options.max_retries} times):")
    run_all(runner, [*delete_commands(options), *create_commands(options)])
    print("# when the VM is up and not training:")
    run_all(runner, [install_command(options), train_command(options)])


# ---------------------------------------------------------------------------------------------
# Command line


def _add_target(parser):
    group = parser.add_argument_group("TPU")
    group.add_argument("--zone", required=True, help="e.g. us-central2-b (v4), us-west4-a (v5e)")
    group.add_argument("--name", required=True, help="TPU VM name")
    group.add_argument("--project", help="Google Cloud project (default: gcloud's configured one)")
    group.add_argument("--queued", action="store_true", help="use a queued resource NAME-qr (waits for capacity)")
    _add_dry_run(parser)


def _add_dry_run(parser):
    parser.add_argument("--dry-run", action="store_true", help="print the commands, one per line, and run nothing")


def _add_machine(parser):
    group = parser.add_argument_group("machine")
    group.add_argument("--accelerator-type", default="v4-8", help="default: %(default)s")
    group.add_argument(
        "--runtime-version",
        help=f"TPU software version (default: {DEFAULT_RUNTIME} for v2-v4, "
        f"{', '.join(f'{v} for {k}' for k, v in BASE_RUNTIMES.items())})",
    )
    group.add_argument("--spot", action="store_true", help="Spot VM: cheaper, can be preempted at any time")
    group.add_argument("--preemptible", action="store_true", help="legacy preemptible TPU VM (not with --queued)")


def _add_package(parser):
    group = parser.add_argument_group("package")
    group.add_argument(
        "--package",
        default="checkout",
        help="'checkout' (git archive of this checkout's HEAD, staged in "
        "RUN_DIR/launcher) or a pip requirement such as git+https://github.com/ORG/concise-attention",
    )
    group.add_argument(
        "--tf-package",
        default="tensorflow-tpu==2.20.0",
        help="TensorFlow build for the TPU, installed over `tensorflow` (default: %(default)s; 'none' to skip)",
    )


def _add_run(parser):
    group = parser.add_argument_group("run")
    group.add_argument("--run-dir", required=True, help="gs://BUCKET/runs/NAME: checkpoints, logs, resumed from")
    group.add_argument("--config", required=True, help="preset name, e.g. lm1b_fixed_d256_p32_h8")
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, repeatable, e.g. training.train_steps=100000",
    )
    group.add_argument("--data-dir", help="gs:// folder of the data (sets task.data_dir)")
    group.add_argument(
        "--max-restarts",
        type=int,
        default=100,
        help=f"restarts after exit code {RESTART_EXIT_CODE} on one VM (default: %(default)s)",
    )


def _add_supervision(parser):
    group = parser.add_argument_group("supervision")
    group.add_argument(
        "--poll-interval", type=int, default=300, help="seconds between state checks (default: %(default)s)"
    )
    group.add_argument(
        "--max-retries",
        type=int,
        default=20,
        help="recreations (and failed launches) before giving up (default: %(default)s)",
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `%(prog)s SUBCOMMAND --help` for the options of each.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    subcommand = {}
    for name, summary in (
        ("create", "create the TPU VM (or queued resource)"),
        ("install", "install the package and the TPU build of TensorFlow on every worker"),
        ("train", "start concise-train on every worker, detached, restarted after exit code 75"),
        ("up", "create + install + train"),
        ("supervise", "poll the VM; after preemption delete, recreate, reinstall and relaunch (resumes from gs://)"),
        ("status", "print the VM state and the run status"),
        ("logs", "tail the training log on a worker (or print the copies saved in the bucket)"),
        ("tensorboard", "open TensorBoard on RUN_DIR/logs"),
        ("upload-data", "copy a local data folder to gs:// (gcloud storage rsync)"),
        ("delete", "delete the TPU VM (or queued resource)"),
    ):
        subcommand[name] = commands.add_parser(name, help=summary, description=summary)
    for name in ("create", "install", "train", "up", "supervise", "status", "logs", "delete"):
        _add_target(subcommand[name])
    for name in ("create", "up", "supervise"):
        _add_machine(subcommand[name])
    for name in ("install", "up", "supervise"):
        _add_package(subcommand[name])
    subcommand["install"].add_argument("--run-dir", help="gs://BUCKET/runs/NAME (where --package checkout is staged)")
    for name in ("train", "up", "supervise"):
        _add_run(subcommand[name])
    _add_supervision(subcommand["supervise"])
    subcommand["status"].add_argument("--run-dir", help="gs://BUCKET/runs/NAME: also print the run's status")
    _add_logs_options(subcommand["logs"])
    subcommand["tensorboard"].add_argument("--run-dir", required=True, help="gs://BUCKET/runs/NAME")
    subcommand["tensorboard"].add_argument("--port", type=int, default=6006, help="default: %(default)s")
    subcommand["upload-data"].add_argument("--source", required=True, help="local folder")
    subcommand["upload-data"].add_argument("--data-dir", required=True, help="gs://BUCKET/PATH to copy it to")
    subcommand["upload-data"].add_argument("--project", help="Google Cloud project (default: gcloud's configured one)")
    for name in ("tensorboard", "upload-data"):
        _add_dry_run(subcommand[name])
    return parser


def _add_logs_options(parser):
    parser.add_argument("--worker", default="0", help="worker index (default: %(default)s)")
    parser.add_argument("--lines", type=int, default=100, help="last lines to show (default: %(default)s)")
    parser.add_argument(
        "--no-follow", dest="follow", action="store_false", help="print and return instead of following"
    )
    parser.add_argument("--saved", action="store_true", help="print the copies in RUN_DIR/launcher/ (also of lost VMs)")
    parser.add_argument("--run-dir", help="gs://BUCKET/runs/NAME (with --saved)")


def options_from(args):
    """The Options named by parsed arguments (fields a subcommand lacks keep their defaults)."""
    values = {
        field.name: getattr(args, field.name) for field in dataclasses.fields(Options) if hasattr(args, field.name)
    }
    if "overrides" in values:
        values["overrides"] = tuple(values["overrides"])
    return Options(**values)


_COMMANDS = {
    "create": create_commands,
    "install": lambda options: [*stage_commands(options), install_command(options)],
    "train": lambda options: [train_command(options)],
    "logs": lambda options: [logs_command(options)],
    "tensorboard": lambda options: [tensorboard_command(options)],
    "upload-data": lambda options: [upload_data_command(options)],
    "delete": delete_commands,
}


def _status(options, runner):
    if runner.dry:
        run_all(runner, [state_command(options), *([status_command(options)] if options.run_dir else [])])
        return
    print(f"{options.name}: {read_state(options, runner)}")
    if options.run_dir:
        print(f"{options.run_dir}: {read_run_status(options, runner) or 'not started'}")


def main(argv=None, runner=None, sleep=time.sleep):
    """Entry point; `runner` and `sleep` are replaceable (tests run it with fakes, no network)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = options_from(args)
        runner = runner or (DryRun() if args.dry_run else Shell())
        if args.command == "logs" and options.saved and not options.run_dir:
            raise ValueError("logs --saved reads RUN_DIR/launcher/: give --run-dir gs://BUCKET/PATH")
        if args.command == "supervise":
            if runner.dry:
                print_supervision_plan(options, runner)
                return 0
            return supervise(options, runner, sleep)
        if args.command == "up":
            up(options, runner, sleep)
        elif args.command == "status":
            _status(options, runner)
        else:
            run_all(runner, _COMMANDS[args.command](options))
    except ValueError as error:
        parser.exit(2, f"{PROG} {args.command}: error: {error}\n")
    except CommandFailed as error:
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return error.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
