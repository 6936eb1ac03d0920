"""Command line: ``rollwise train | eval | compare | swarm | config show`` (typer). Each command is one
Python call (``rollwise.train(cfg)``, ``rollwise.evaluate(run_dir)``, ``rollwise.bench.compare(sweep)``,
``rollwise.distributed.swarm.run_swarm``,
``load_config``). User errors print a one-paragraph message naming the culprit and exit with
status 2, without a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from rollwise import progress
from rollwise.registry import UserError

app = typer.Typer(
    add_completion=True, no_args_is_help=True, help="rollwise: compute-efficient RLVR for language models."
)
config_app = typer.Typer(no_args_is_help=True, help="Inspect configuration.")
app.add_typer(config_app, name="config")
console = Console()


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from rollwise import __version__

        try:
            torch = version("torch")
        except PackageNotFoundError:
            torch = "not installed"
        console.print(f"rollwise {__version__} (torch {torch}, typer {typer.__version__})", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
):
    """rollwise: compute-efficient RLVR for language models."""


ConfigOpt = typer.Option(None, "--config", "-c", help="TOML config file.")
SetOpt = typer.Option(None, "--set", "-s", help="Override: section.key=value (repeatable).")


def _load(config: Optional[Path], overrides: Optional[List[str]], resume: Optional[Path] = None):
    from rollwise.config import load_config

    if resume is not None:
        resolved = resume / "config.resolved.toml"
        if not resolved.is_file():
            raise UserError(f"cannot resume {resume}: no config.resolved.toml there")
        base = [f"run.dir={resume.parent.as_posix()!r}".replace("'", '"'), f'run.name="{resume.name}"']
        return load_config(config or resolved, base + list(overrides or []))
    return load_config(config, overrides or [])


@app.command()
def train(
    config: Optional[Path] = ConfigOpt,
    set: Optional[List[str]] = SetOpt,
    resume: Optional[Path] = typer.Option(None, "--resume", help="Resume runs/<name> from its latest checkpoint."),
):
    """Train. With no arguments: the embedded default (arithmetic task, tiny model, CPU)."""
    import rollwise
    from rollwise.distributed.data_parallel import env_rank

    cfg = _load(config, set, resume)
    if resume is None:
        cfg = cfg.with_run_name()  # the directory it will write (a default name never reuses a run)
    say = console.print if env_rank() == 0 else (lambda *a, **k: None)  # torchrun: rank 0 speaks for the run
    tc = cfg.train
    from rollwise import defaults

    steps = (
        tc.steps
        if defaults.is_set(cfg, "train.steps")
        else defaults.profile(cfg.model.name).settings.get("train.steps", tc.steps)
    )
    budget = "".join(
        f", budget {v:,} {k.replace('_', ' ')}"
        for k, v in (("generated tokens", tc.budget_generated_tokens), ("rollouts", tc.budget_rollouts))
        if v
    )
    say(
        f"[bold]rollwise[/] run [cyan]{cfg.run_dir()}[/] — task {cfg.task.name}, model {cfg.model.name}, "
        f"controller {cfg.control.name}, objective {cfg.objective.name}, at most {steps} steps{budget}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        result = rollwise.train(
            cfg,
            resume=resume is not None,
            log=lambda m: console.print(f"[dim]{escape(m)}[/]", highlight=False, soft_wrap=True),
        )
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (main() turns it into this)
        say(_resume_hint(cfg.run_dir()), highlight=False, soft_wrap=True)
        raise
    finally:
        _stop_ray()
    say(f"[green]done[/]: {result.summary()}", soft_wrap=True)
    if hint := result.noise_hint():
        say(f"[yellow]note[/]: {hint}", highlight=False, soft_wrap=True)
    say(f"files: {result.run_dir}/ (metrics.jsonl, eval.jsonl, plots/, checkpoints/)", soft_wrap=True)


def _resume_hint(run_dir: Path) -> str:
    """What an interrupted run leaves, said as it is: its newest checkpoint, or none (then a
    resume starts the run again from step 0; the warm start says above what it kept)."""
    from rollwise.trainer.checkpoint import latest_step

    if not (run_dir / "config.resolved.toml").is_file():
        return "interrupted before the run directory was written: nothing to resume; rerun the same command"
    step = latest_step(run_dir)
    if step is None:
        return (
            f"interrupted before the first checkpoint: no training step is saved. rollwise train --resume {run_dir} "
            f"starts this run again from step 0 (a cached warm start is reused, an interrupted one continues "
            f"where it was saved)"
        )
    return (
        f"continue with: rollwise train --resume {run_dir}  (from its checkpoint at step {step}; "
        f"steps after it are trained again)"
    )


def _stop_ray() -> None:
    """Shut down a Ray this process started before the interpreter tears down, however the run ended:
    after asynchronous runs on Ray workers, 3 of ~24 benchmark processes segfaulted at exit (exit -11,
    every file already written) while Ray's own exit hook ran; an explicit shutdown while the interpreter
    is whole avoids it. The run has done so already once its pools were closed (``Run.close``); this is
    the net for a failure before the run existed. Through ``ray_pool.shutdown``, so that pools built on
    this Ray never call into it afterwards (issue #47)."""
    ray_pool = sys.modules.get("rollwise.distributed.ray_pool")
    if ray_pool is not None:
        ray_pool.shutdown()


@app.command("eval")
def eval_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>)."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest that verifies)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", "-t", min=0.0, help="Sampling temperature (default: the run's eval.temperature)."
    ),
    samples: Optional[int] = typer.Option(
        None, "--samples", "-n", min=1, help="Samples per held-out prompt (default: the run's eval.samples)."
    ),
    n_prompts: Optional[int] = typer.Option(
        None, "--prompts", min=1, help="Held-out prompts evaluated (default: the run's eval.n_prompts)."
    ),
):
    """Evaluate a run's checkpoint on its held-out split (read-only: the run's files are left as they are)."""
    import rollwise

    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    m = rollwise.evaluate(
        run_dir,
        step=step,
        temperature=temperature,
        samples=samples,
        n_prompts=n_prompts,
        log=lambda s: console.print(f"[dim]{escape(s)}[/]", highlight=False, soft_wrap=True),
    )
    console.print(
        f"evaluated {run_dir / 'checkpoints' / m.pop('checkpoint')} (trained steps: {m.pop('step')})",
        highlight=False,
        soft_wrap=True,
    )
    for k, v in m.items():
        console.print(f"{k:24s} {v}", highlight=False)


@app.command()
def compare(
    config: Path = typer.Option(
        ..., "--config", "-c", help="Sweep file (benchmarks/<name>.toml): base config, arms, seeds, budget."
    ),
    set: Optional[List[str]] = typer.Option(
        None, "--set", "-s", help="Override for every arm: section.key=value (repeatable)."
    ),
    out_dir: Optional[Path] = typer.Option(
        None, "--out-dir", help="Runs and report directory (default: the sweep's out_dir)."
    ),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", "-j", min=1, help="Runs trained at once in separate processes (default: the sweep's jobs)."
    ),
):
    """Run arms x seeds on one budget (skipping finished runs, resuming interrupted ones); write compare.json and
    report.html."""
    from rollwise.bench import compare as run_compare

    if not config.is_file():
        raise UserError(f"sweep file not found: {config}")
    result = run_compare(
        config, set or [], out_dir, jobs, log=lambda m: console.print(m, markup=False, highlight=False, soft_wrap=True)
    )
    out = Path(result["sweep"]["out_dir"])
    t = result["target"]["value"]
    tgt = result["target"]
    console.print(
        f"[bold]target pass@1 {t:.3f}[/] (rule {escape(tgt['rule'])}: {escape(tgt['source'])}; baseline seeds "
        f"reaching it: {tgt['baseline_seeds_reached']})",
        highlight=False,
        soft_wrap=True,
    )
    at_start = result["target"].get("reached_at_start_by_every_arm")
    if at_start:
        console.print(
            "  tokens and seconds to target: not shown, the target is reached at step 0 (see the warning below)",
            highlight=False,
        )
    for arm, a in result["arms"].items():
        m = a["metrics"]
        ttt, sec = m["tokens_to_target"]["value"], m["seconds_to_target"]["value"]
        to_target = (
            ""
            if at_start
            else (
                f"tokens to target {'not reached' if ttt is None else f'{ttt:,.0f}':>12s}   "
                f"seconds to target {'not reached' if sec is None else f'{sec:,.1f}':>11s}"
                + (
                    f" {a['confounded']['seconds_to_target']}"
                    if a.get("confounded", {}).get("seconds_to_target")
                    else ""
                )
                + "   "
            )
        )
        paired = (a.get("paired") or {}).get("tokens_to_target")
        if paired and not at_start:  # the saving against the baseline, seed by seed (analysis.paired_saving)
            lo, hi = paired["ci"]
            v = "not reached" if paired["value"] is None else f"x{paired['value']:.2f}"
            to_target += (
                f"paired saving {v} [{'-' if lo is None else f'{lo:.2f}'}, {'open' if hi is None else f'{hi:.2f}'}]"
                f"{' separated' if paired['separation'] else ''}   "
            )
        console.print(
            f"  {arm:20s} {to_target}AUC {m['auc']['value']:.3f}   final pass@1 {m['final_pass@1']['value']:.3f}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for w in result.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    console.print(f"files: {out / 'compare.json'}, {out / 'report.html'}", soft_wrap=True)


@app.command()
def report(out_dir: Path = typer.Argument(..., help="A compare output directory (holding compare.json).")):
    """Redraw the plot and report.html from an existing compare.json (nothing is trained)."""
    from rollwise.bench.report import redraw

    paths = redraw(out_dir)
    console.print(f"files: {', '.join(str(p) for p in paths)}", soft_wrap=True)


@app.command()
def swarm(
    config: Optional[Path] = ConfigOpt,
    set: Optional[List[str]] = SetOpt,
    peers: int = typer.Option(2, "--peers", "-n", help="Number of peers (processes) to start."),
    ray: bool = typer.Option(False, "--ray", help="Start the peers as Ray tasks (locally, or on --address)."),
    address: Optional[str] = typer.Option(
        None,
        "--address",
        help="Ray cluster to join, host:port (implies --ray); "
        "the swarm directory must be on a filesystem every node sees.",
    ),
):
    """SAPO: train N peers at once that share their rollouts as text (replay 'sapo'); write swarm.json."""
    from rollwise.distributed.swarm import run_swarm

    result = run_swarm(
        config,
        set or [],
        peers,
        log=lambda m: console.print(f"[dim]{escape(m)}[/]", highlight=False, soft_wrap=True),
        ray=ray,
        address=address,
    )
    for name, p in result["peers"].items():
        acc = (
            "no evaluation" if p["last_pass@1"] is None else f"pass@1 {p['first_pass@1']:.3f} -> {p['last_pass@1']:.3f}"
        )
        state = "done" if p["returncode"] == 0 else f"[red]failed (exit {p['returncode']})[/]"
        console.print(
            f"  {name}: {state}, {p['steps']} steps, {acc}, {p['generated_tokens']:,} generated tokens, "
            f"{p['received_rollouts']:,} received rollouts",
            highlight=False,
            soft_wrap=True,
        )
    root = Path(next(iter(result["peers"].values()))["run_dir"]).parent
    console.print(f"files: {root}/ (peer-<k>/, peer-<k>.log, shared/, swarm.json)", soft_wrap=True)
    if any(p["returncode"] != 0 for p in result["peers"].values()):
        raise typer.Exit(1)


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>)."),
    out_dir: Path = typer.Argument(..., help="Output directory (must not exist or be empty)."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest that verifies)."),
    adapter: bool = typer.Option(
        False, "--adapter", help="LoRA runs: write the PEFT adapter instead of merged weights."
    ),
    gguf: bool = typer.Option(False, "--gguf", help="Also write OUT_DIR/model.gguf (float32, Llama architecture)."),
):
    """Export a checkpoint as a Hugging Face model directory (from_pretrained loads it), optionally with a GGUF file."""
    from rollwise.export import export_run

    out = export_run(
        run_dir,
        out_dir,
        step=step,
        adapter=adapter,
        gguf=gguf,
        log=lambda m: console.print(f"[dim]{escape(m)}[/]", highlight=False, soft_wrap=True),
    )
    console.print(f"[green]exported[/]: {out}/", highlight=False, soft_wrap=True)


@app.command("distill-diagnose")
def distill_diagnose(
    run_dir: Path = typer.Argument(..., help="A run directory (runs/<name>): its checkpoint is the student."),
    teacher: List[str] = typer.Option(
        ...,
        "--teacher",
        help="A candidate teacher (repeatable): 'answer' (the student with the answer in its context) or "
        "'checkpoint:PATH' (a checkpoints/step-<N> directory, or a run directory for its newest checkpoint).",
    ),
    out: Path = typer.Option(Path("distill-diagnose"), "--out", help="Where distill.json and distill.png go."),
    step: Optional[int] = typer.Option(
        None, "--step", help="Student checkpoint step (default: the newest that verifies)."
    ),
    n_prompts: int = typer.Option(16, "--prompts", min=1, help="Held-out prompts."),
    samples: int = typer.Option(
        8, "--samples", "-n", min=2, help="Student rollouts per prompt (the baseline needs 2)."
    ),
):
    """Score distillation teachers by the alignment of their reverse-KL gradient with the student's success gradient,
    on correct and incorrect rollouts (read-only: the run's files are left as they are)."""
    from rollwise.bench.distill import diagnose

    result = diagnose(
        run_dir,
        teacher,
        out,
        step=step,
        n_prompts=n_prompts,
        samples=samples,
        log=lambda m: console.print(f"[dim]{escape(m)}[/]", highlight=False, soft_wrap=True),
    )
    for name, t in result["teachers"].items():
        cells = []
        for cls in ("correct", "incorrect"):
            a = t["summary"][cls]["alignment_mean"]
            cells.append(f"{cls} {'-' if a is None else f'{a:+.3f}'} ({t['summary'][cls]['with_signal']} rollouts)")
        console.print(f"  {name:28s} alignment: {'   '.join(cells)}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"files: {out / 'distill.json'}, {out / 'distill.png'}", soft_wrap=True)


@app.command()
def runs(root: Path = typer.Argument(Path("runs"), help="Directory holding run directories (searched recursively).")):
    """List the runs in a directory: steps, generated tokens, last pass@1, newest checkpoint, state.
    On a terminal a table (long names wrap, never cut); piped, tab-separated lines with full names."""
    from rich.table import Table

    from rollwise.runs import list_runs

    header = ("run", "steps", "tokens", "pass@1 (at step)", "checkpoint", "state")
    rows = [
        (
            r["name"],
            f"{r['steps']}/{r['max_steps']}",
            f"{r['tokens']:,}",
            "-" if r["pass@1"] is None else f"{r['pass@1']:.3f} ({r['eval_step']})",
            "-" if r["checkpoint"] is None else f"step-{r['checkpoint']}",
            r["state"],
        )
        for r in list_runs(root)
    ]
    if not console.is_terminal:  # `rollwise runs | cat`, grep, cut: one line per run, nothing truncated
        for row in (header, *rows):
            print("\t".join(row))
        return
    table = Table(*header)
    table.columns[0].overflow = "fold"
    for row in rows:
        table.add_row(*row)
    console.print(table)


@config_app.command("show")
def config_show(config: Optional[Path] = ConfigOpt, set: Optional[List[str]] = SetOpt):
    """Print the resolved configuration as TOML: every key with its description, unset keys and
    strategy options as commented lines. Validates exactly as `rollwise train` does before the model."""
    from rollwise import components
    from rollwise.config_doc import annotated_toml

    cfg = _load(config, set)
    components.build_task(cfg)  # what train checks before the model: files, dataset names, non-empty splits
    console.print(annotated_toml(cfg), markup=False, highlight=False, soft_wrap=True)


@config_app.command("options")
def config_options(
    section: str = typer.Argument(..., help="task, control, replay, filter, advantage or objective."),
    name: Optional[str] = typer.Argument(None, help="A name in that section, e.g. jsonl, reasoning_gym, dars."),
):
    """List a strategy's options with their defaults and descriptions (without NAME: the section's names)."""
    from rollwise.config_doc import options_text

    console.print(options_text(section, name), markup=False, highlight=False, soft_wrap=True)


def _usage_error_types() -> tuple[type, ...]:
    """Usage-error base classes of the click that typer runs on: typer >= 0.29 bundles its own
    click (``typer.TyperException`` is the base of its ``ClickException``); older typers use the
    ``click`` package. Checking only ``click.ClickException`` misses the bundled one."""
    types_: list[type] = []
    if hasattr(typer, "TyperException"):
        types_.append(typer.TyperException)
    try:
        import click

        types_.append(click.ClickException)
    except ImportError:
        pass
    return tuple(types_)


_TERMINATED = False  # set by the SIGTERM handler: the interrupt came from `kill`, a scheduler, a timeout


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (kill, cluster schedulers, `timeout`) as Ctrl-C: the same clean-up and message.
    Ctrl-C reaches every process of the terminal's group; SIGTERM only this one, so the runs that
    ``rollwise compare -j`` trains in child processes get the SIGINT they would have had."""
    import multiprocessing
    import os
    import signal

    global _TERMINATED
    _TERMINATED = True
    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGINT)
        except OSError:  # ended meanwhile
            pass
    raise KeyboardInterrupt


def _aborted() -> None:
    if _TERMINATED:
        console.print("[red]aborted[/] (terminated: SIGTERM)", highlight=False)
        sys.exit(143)
    console.print("[red]aborted[/] (interrupted)", highlight=False)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user and usage errors print one line and exit 2; Ctrl-C prints "aborted" and
    exits 130 (so ``rollwise compare ... && publish`` stops); SIGTERM does the same, exiting 143."""
    import os
    import signal
    import threading

    # The command line never downloads (the library itself loads with local_files_only and sets no
    # variable): set before transformers / huggingface_hub are imported, which read it at import.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if progress.plain():
        # no transformers progress bars ("Loading weights", "Writing model shards") where rollwise's own
        # bar gives way to plain lines: in a log or a pipe their carriage returns are noise
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    global _TERMINATED
    _TERMINATED = False  # main() called again in one process (tests, notebooks)
    previous = None
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _main(argv)
    finally:
        if previous is not None:  # main() called in-process (tests, notebooks) leaves the handler as it found it
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> None:
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="rollwise")
    except UserError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _aborted()
    except _usage_error_types() as e:  # unknown command or option, missing argument
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        msg = e.format_message()
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `rollwise`: the help is the answer
            console.print(msg, markup=False, highlight=False)
        else:
            console.print(f"[bold red]error:[/] {escape(msg + hint)}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2) or 2)
    # in non-standalone mode typer turns Ctrl-C into Exit(130) and returns the code
    if rc == 130:
        _aborted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)


if __name__ == "__main__":
    main()
