"""What the CLI prints: 80-column tables and progress bar, JSON in full precision,
one trial identity (``EXPERIMENT.NUMBER`` / ``#NUMBER``), names that must be unique."""

from __future__ import annotations

import datetime as _dt
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from searcher.cli.tables import (
    describe_rows,
    experiment_rows,
    experiments_table,
    queue_rows,
    queue_table,
    task_rows,
    tasks_table,
    trials_table,
)
from searcher.driver.progress import SearchProgress
from searcher.experiments import UsageError, find_experiment
from storage import Experiment, Trial, TrialState, session_scope
from tests.searcher.conftest import run_cli
from tests.trials.test_control import make_experiment
from trials.coordination.allocations import SlotHolder
from trials.coordination.cluster_queue import QueuedView
from trials.queries import TrialCounts

LR = 0.03833332156156663


def render(renderable: object, width: int = 80) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def assert_fits(text: str, width: int = 80) -> None:
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "…" not in text, text


@pytest.fixture
def finished(db_url: str, tmp_path: Path) -> int:
    """A COMPLETED experiment with long hyperparameter lists and an unrounded metric."""
    experiment_id = make_experiment(db_url, tmp_path / "exp", "COMPLETED")
    with session_scope(db_url) as session:
        for trial in session.query(Trial).filter(Trial.experiment_id == experiment_id):
            trial.hparams = {
                "lr": LR,
                "optimizer": "adamw",
                "weight_decay": 1.2345678e-05,
                "global_batch_size": 512,
                "lr_decay": "cosine",
                "warmup_epochs": 3,
            }
            if trial.state == TrialState.COMPLETED:
                trial.searcher_metric_value = 0.123456789
            else:
                trial.state = TrialState.ERROR
                trial.error = "ValueError: bad shape (rank 1)"
    return experiment_id


def test_list_and_describe_at_80_columns(db_url: str, finished: int) -> None:
    with session_scope(db_url) as session:
        listing = render(experiments_table(experiment_rows(session)))
        described = describe_rows(session, find_experiment(session, str(finished)))
    assert_fits(listing)
    assert "0.1235" in listing and "COMPLETED" in listing and "2/2" in listing
    table = render(trials_table(described))
    assert_fits(table)
    assert "lr=0.03833" in table and "0.03833332" not in table
    assert "0.1235" in table
    # The trial column shows the experiment's trial numbers; the long lists fold.
    assert "#0" in table and "#1" in table
    assert "warmup_epochs=3" in table.replace("\n", "").replace("│", "").replace(" ", "")
    assert described["trials"][0]["trial"] == f"{finished}.0"
    assert described["checkpoint_folder"].startswith(f"{finished}-")


def test_progress_bar_keeps_count_and_time_at_80_columns() -> None:
    console = Console(record=True, width=80, file=io.StringIO())
    with SearchProgress(total=32, metric="validation_loss", console=console) as progress:
        progress.update(
            TrialCounts(total=20, running=4, completed=12, pruned=2, errored=1), 0.0383333
        )
    text = console.export_text()
    assert_fits(text)
    assert "15/32" in text and "0:00:0" in text
    assert "failed 1" in text and "0.03833" in text


def test_task_list_names_trials_by_experiment_and_number() -> None:
    holders = [
        SlotHolder(
            "default", "local", "127.0.0.1", 0, experiment_id=3, trial_id=35, trial_number=1
        ),
        SlotHolder("default", "local", "127.0.0.1", 1),
    ]
    rows = task_rows(holders)
    assert [r["trial"] for r in rows] == ["3.1", None]
    text = render(tasks_table(rows))
    assert_fits(text)
    assert "3.1" in text and "35" not in text
    assert "warm job" not in text  # the column is there only when a warm job holds slots


def _warm_slots(db_url: str, tmp_path: Path) -> tuple[Path, dict[str, int]]:
    """Slots of warm jobs in each state on long-named agents, their rows inserted as the
    ledger and ``trials.coordination.warm_jobs`` leave them; the cluster file and the job ids.

    Trial and job numbers run to 5 digits, so the table's widest cells are tried.
    """
    import yaml

    from storage import Allocation, WarmJob, utcnow
    from tests.conftest import add_experiment

    pool, host = "research-a100-pool", "10.20.30.40"
    agents = [f"gpu-node-{i:04d}.cluster.example.org" for i in range(5)]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "resource_pools": [
                    {
                        "name": pool,
                        "agents": [{"name": a, "host": host, "slots": 2} for a in agents],
                    }
                ]
            }
        )
    )
    experiment_id, (done, running, reserved, ended, cold) = add_experiment(
        db_url,
        [
            {"state": TrialState.COMPLETED, "optuna_trial_number": 12344},
            {"optuna_trial_number": 12345},
            {"state": TrialState.QUEUED, "optuna_trial_number": 12346},
            {"state": TrialState.PRUNED, "optuna_trial_number": 12347},
            {"optuna_trial_number": 12348},
        ],
        name="warm",
    )
    now = utcnow()
    jobs = {"running": 12345, "reserved": 12346, "idle": 12347, "ending": 12348}
    job_fields: dict[str, dict[str, object]] = {
        "running": {"current_trial_id": running},
        "reserved": {"reserved_trial_id": reserved, "idle_since": now},
        "idle": {"idle_since": now},
        "ending": {"idle_since": now, "end_requested_at": now, "end_reason": "no trial waits"},
    }
    # The trial each job's ledger rows name: the reserved trial once a decision
    # reserved the job, else the last trial it ran (over, for an idle or ending job).
    row_trial = {"running": running, "reserved": reserved, "idle": done, "ending": ended}
    with session_scope(db_url) as session:
        for (state, job_id), agent in zip(jobs.items(), agents, strict=False):
            session.add(
                WarmJob(
                    id=job_id,
                    experiment_id=experiment_id,
                    resource_pool=pool,
                    slots=2,
                    placement=[{"agent": agent, "host": host, "slots": [0, 1]}],
                    launch_token=f"token-{job_id}",
                    trials_run=1,
                    **job_fields[state],
                )
            )
        held = [
            (agent, job_id, row_trial[state])
            for (state, job_id), agent in zip(jobs.items(), agents, strict=False)
        ]
        held.append((agents[4], None, cold))
        session.add_all(
            Allocation(
                resource_pool=pool,
                agent=agent,
                host=host,
                slot=slot,
                trial_id=trial_id,
                experiment_id=experiment_id,
                lease_expires_at=now + _dt.timedelta(seconds=300),
                warm_job_id=job_id,
            )
            for agent, job_id, trial_id in held
            for slot in (0, 1)
        )
    return cluster, jobs


def test_task_list_shows_warm_jobs_idle_or_running_which_trial_in_80_columns(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searcher.cli import main
    from trials.coordination import allocations
    from trials.executors import load_cluster

    cluster, jobs = _warm_slots(db_url, tmp_path)
    capsys.readouterr()
    assert main(["task", "list", "--json", "--db", db_url, "--cluster", str(cluster)]) == 0
    rows = json.loads(capsys.readouterr().out)["slots"]
    experiment = rows[0]["experiment"]
    seen = [(r["trial"], r["warm_job_id"], r["warm_state"]) for r in rows[::2]]
    # An idle or ending job holds its slots without a trial: its last one is over.
    assert seen == [
        (f"{experiment}.12345", jobs["running"], "running"),
        (f"{experiment}.12346", jobs["reserved"], "reserved"),
        (None, jobs["idle"], "idle"),
        (None, jobs["ending"], "ending"),
        (f"{experiment}.12348", None, None),
    ]
    assert all(r["experiment"] == experiment for r in rows)
    with session_scope(db_url) as session:
        text = render(tasks_table(task_rows(allocations.holders(session, load_cluster(cluster)))))
    assert_fits(text)
    # A column for the warm job: its id and state; an idle or ending job shows no trial.
    lines = [line.split() for line in text.splitlines() if "10.20.30.40" in line]
    assert [line[5:] for line in lines[::2]] == [
        [f"{experiment}.12345", "12345", "running"],
        [f"{experiment}.12346", "12346", "reserved"],
        ["-", "12347", "idle"],
        ["-", "12348", "ending"],
        [f"{experiment}.12348", "-"],
    ]
    assert f"{experiment}.12344" not in text and f"{experiment}.12347" not in text
    # The agents table counts a warm job's slots as in use, idle or not.
    assert main(["agents", "--db", db_url, "--cluster", str(cluster)]) == 0
    agents = capsys.readouterr().out
    assert [line.split()[-3] for line in agents.splitlines() if "gpu-node-" in line] == ["2"] * 5


def test_task_list_and_agents_show_which_trials_share_a_slot_and_what_is_free(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 52: a slot that share trials hold is listed once per share and once for what
    is free of it; agents count a share at its fraction and say what is free."""
    import yaml

    from searcher.cli import main
    from tests.conftest import add_experiment
    from trials.coordination import allocations
    from trials.scheduler import Agent, AgentSlots, Placement

    cluster = tmp_path / "cluster.yaml"
    agent = {"name": "a0", "host": "127.0.0.1", "slots": 2}
    cluster.write_text(
        yaml.safe_dump({"resource_pools": [{"name": "default", "agents": [agent]}]})
    )
    experiment, (quarter, half, whole) = add_experiment(db_url, [{}] * 3, name="shares")
    a0 = Agent("a0", "127.0.0.1", (0, 1))
    with session_scope(db_url) as session:
        for trial, slot, share in ((quarter, 0, 0.25), (half, 0, 0.5), (whole, 1, 1.0)):
            placed = Placement(trial, "default", (AgentSlots(a0, (slot,)),), share=share)
            assert allocations.claim(
                session, placed, trial_id=trial, experiment_id=experiment, lease_s=300
            )
    capsys.readouterr()
    assert main(["task", "list", "--json", "--db", db_url, "--cluster", str(cluster)]) == 0
    rows = json.loads(capsys.readouterr().out)["slots"]
    assert [(r["slot"], r["trial"], r["share"]) for r in rows] == [
        (0, f"{experiment}.1", 0.5),
        (0, f"{experiment}.0", 0.25),
        (0, None, 0.25),
        (1, f"{experiment}.2", 1.0),
    ]
    assert main(["task", "list", "--db", db_url, "--cluster", str(cluster)]) == 0
    text = capsys.readouterr().out
    assert_fits(text)
    lines = [line.split() for line in text.splitlines() if "127.0.0.1" in line]
    assert [line[-1] for line in lines] == ["1/2", "1/4", "free", "1"]
    assert lines[2][-2:] == ["1/4", "free"]
    assert main(["agents", "--db", db_url, "--cluster", str(cluster)]) == 0
    text = capsys.readouterr().out
    assert_fits(text)
    (row,) = [line.split() for line in text.splitlines() if "127.0.0.1" in line]
    assert row[:5] == ["default", "a0", "127.0.0.1", "0,1", "1.75"]
    assert "default/a0: 1 shared slot, 1/4 of a slot free on it" in text


def test_a_share_in_the_queue_shows_as_its_fraction() -> None:
    view = QueuedView(
        "default", 2, "small", 5, 0, 1, 42, 1.0, _dt.datetime(2025, 1, 1), (), "why", share=0.125
    )
    rows = queue_rows([view], _dt.datetime(2025, 1, 1, 0, 0, 5))
    assert (rows[0]["slots"], rows[0]["share"]) == (1, 0.125)
    (line,) = [line.split() for line in render(queue_table(rows)).splitlines() if "2.0" in line]
    assert line[:5] == ["1", "2.0", "default", "42", "1/8"]


def test_the_queue_reads_in_order_with_each_reason_in_80_columns() -> None:
    import datetime as _dt

    now = _dt.datetime(2026, 11, 23, 12, 0, 0)

    def view(number: int, reason: str | None, placed: tuple[str, ...] = ()) -> QueuedView:
        return QueuedView(
            pool="default",
            experiment_id=2,
            experiment_name="digits-a-rather-long-experiment-name",
            trial_id=40 + number,
            trial_number=number,
            slots=4,
            priority=1,
            weight=1.0,
            queued_at=now - _dt.timedelta(seconds=75),
            placed_on=placed,
            reason=reason,
        )

    rows = queue_rows(
        [
            view(0, None, placed=("agent-a", "agent-b")),
            view(
                1,
                "agents agent-a, agent-b reserved for trial 2.0 by backfilling; "
                "preempting trials 1.3, 1.4 to make room",
            ),
            view(2, None),
        ],
        now,
    )
    assert [r["position"] for r in rows] == [1, 2, 3]
    assert [r["trial"] for r in rows] == ["2.0", "2.1", "2.2"]
    assert rows[0]["reason"] == "placed on agent-a, agent-b; starting"
    assert rows[2]["reason"] == "waiting for the next placement decision"
    assert rows[1]["waiting_s"] == 75.0
    text = render(queue_table(rows))
    assert_fits(text)
    # The reason folds onto more lines; every word of it is there.
    assert "preempting" in text and "75 s" in text


def test_a_name_several_experiments_share_is_refused_with_their_ids(
    db_url: str, tmp_path: Path
) -> None:
    first = make_experiment(db_url, tmp_path / "a", "COMPLETED")
    second = make_experiment(db_url, tmp_path / "b", "COMPLETED")
    with session_scope(db_url) as session:
        name = session.get(Experiment, first).name  # type: ignore[union-attr]
        with pytest.raises(UsageError, match=f"ids {first}, {second}"):
            find_experiment(session, name)
        assert find_experiment(session, str(second)).id == second


@pytest.mark.slow
def test_cli_json_quotes_db_and_control(
    tmp_path: Path, cli_env: dict[str, str], db_url: str, finished: int
) -> None:
    env = {**cli_env, "COLUMNS": "80"}
    db = ["--db", db_url]
    listed = run_cli(["list", "--json", *db], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[0]["best"] == 0.123456789
    described = run_cli(["describe", str(finished), "--json", *db], env, tmp_path)
    assert json.loads(described.stdout)["trials"][0]["hyperparameters"]["lr"] == LR
    table = run_cli(["describe", str(finished), *db], env, tmp_path)
    assert table.returncode == 0 and max(map(len, table.stdout.splitlines())) <= 80
    assert "#1: ValueError: bad shape (rank 1)" in table.stdout
    tasks = run_cli(["task", "list", "--json", "--slots", "2", *db], env, tmp_path)
    listed_tasks = json.loads(tasks.stdout)
    assert [row["trial"] for row in listed_tasks["slots"]] == [None, None]
    assert listed_tasks["queue"] == []
    agents = run_cli(["agents", "--slots", "2", *db], env, tmp_path)
    assert agents.returncode == 0 and "in use" in agents.stdout, agents.stderr
    missing = run_cli(["describe", "digits-small-batch", *db], env, tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith("'digits-small-batch'"), missing.stderr
    # Control from a terminal: a never-started experiment is paused, then killed.
    fresh = make_experiment(db_url, tmp_path / "fresh", "never-started")
    paused = run_cli(["pause", str(fresh), *db], env, tmp_path)
    assert paused.returncode == 0 and f"slotsweep resume {fresh}" in paused.stdout
    killed = run_cli(["kill", str(fresh), *db], env, tmp_path)
    assert killed.returncode == 0 and "CANCELED" in killed.stdout
    again = run_cli(["pause", str(fresh), *db], env, tmp_path)
    assert again.returncode == 2 and "already CANCELED" in again.stderr
    assert "Traceback" not in again.stderr


def test_summary_counts_failures_and_warns_when_some_succeeded(
    db_url: str, finished: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from searcher.cli.commands import _print_summary

    _print_summary(db_url, finished, "COMPLETED")
    out, err = capsys.readouterr()
    assert f"experiment {finished} COMPLETED: 1 completed, 0 pruned, 1 failed" in out
    assert f"warning: 1 of 2 trials failed; `slotsweep describe {finished}` shows why" in err
    assert "#0" in out and "0.1235" in out  # the best trials, by number
