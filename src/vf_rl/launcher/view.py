"""``vf-rl view RUN_DIR [RUN_DIR ...]``: a local web page (Dash, on this machine, offline) for one or
several runs: their curves overlaid (reward, held-out reward, entropy, completion length,
truncation, the ``health/<rule>`` alarms, any other metric chosen) against the step or the seconds
of training, the differences between their resolved configs, and the rollouts of any recorded step
by group (prompt, expected answer, each completion with its reward and advantage).

The page reads the run directories again every few seconds, so a run in progress grows on it.
Dash serves its own scripts (plotly.js, React) from this process: nothing is fetched from elsewhere.
What the page reads is ``view_data.py``; what a run records for it, ``trainer/rollout_log.py``.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from pathlib import Path

from vf_rl.config.errors import ConfigError
from vf_rl.launcher.view_data import HEALTH_PREFIX, Run, alarms, config_differences, groups, load_runs, message_text

EXIT_BAD_INPUT = 2

PANELS = [("reward", "reward (training batch)"), ("eval/reward", "held-out reward"), ("entropy", "entropy (nats/token)"),
          ("tokens/completion", "completion length (tokens, mean)"), ("truncated/rate", "share of rollouts cut at max_tokens")]
"""The curves always shown, ``(metrics key, title)``; then one per ``health/<rule>`` key any run has."""

REFRESH_S = 10
"""Seconds between two reads of the run directories."""

PRE = {"whiteSpace": "pre-wrap", "margin": 0, "fontSize": "13px", "maxHeight": "24em", "overflowY": "auto"}


def graph_id(key: str) -> str:
    """The page's element id of metric ``key``'s graph: ``graph-eval-reward`` for ``eval/reward``."""
    return "graph-" + "".join(c if c.isalnum() else "-" for c in key)


def figure(runs: list[Run], key: str, title: str, against: str):
    """A plotly figure of ``key`` for every run that has it, one line per run named by its label, in
    the run's colour; ``health/`` alarms as steps (0 or 1)."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    fig = go.Figure()
    for i, run in enumerate(runs):
        x, y = run.series(key, against)
        if x:
            fig.add_trace(go.Scatter(x=x, y=y, name=run.label, mode="lines+markers", marker={"size": 5},
                                     line={"color": qualitative.Plotly[i % len(qualitative.Plotly)],
                                           "shape": "hv" if key.startswith(HEALTH_PREFIX) else "linear"}))
    fig.update_layout(title={"text": title, "font": {"size": 14}}, height=300, margin={"l": 50, "r": 10, "t": 40, "b": 40},
                      xaxis_title="step" if against == "step" else "seconds of training", uirevision=key,
                      legend={"orientation": "h", "y": -0.25}, template="plotly_white")
    if key.startswith(HEALTH_PREFIX):
        fig.update_yaxes(range=[-0.1, 1.1], tickvals=[0, 1], ticktext=["ok", "alarm"])
    last = max((x for trace in fig.data for x in trace.x), default=0)
    if against == "step":  # whole steps only
        fig.update_xaxes(tickformat="d", dtick=max(1, -(-int(last) // 10)))
    return fig


def completion_text(completion) -> str:
    """A completion as text: a single assistant message is its content alone, more messages (tool
    calls, the environment's replies) are shown with their roles."""
    if isinstance(completion, list) and len(completion) == 1 and isinstance(completion[0], dict) \
            and completion[0].get("role") == "assistant" and not completion[0].get("tool_calls"):
        return str(completion[0].get("content") or "")
    return message_text(completion)


def run_summary(run: Run) -> str:
    """``run-a (outputs/run-a): 30 steps, 412 s; reward 0.12 -> 0.48; alarms: none``."""
    last = run.steps[-1] if run.steps else {}
    first_reward, last_reward = (run.steps[0].get("reward"), last.get("reward")) if run.steps else (None, None)
    rewards = f"; reward {first_reward:.3f} -> {last_reward:.3f}" if None not in (first_reward, last_reward) else ""
    raised = alarms(run)
    shown = ", ".join(f"{k[len(HEALTH_PREFIX):]} (from step {s})" for k, s in raised.items()) or "none"
    seconds = f", {last['timing/elapsed_s']:.0f} s" if "timing/elapsed_s" in last else ""
    return f"{run.label} ({run.path}): {len(run.steps)} steps{seconds}{rewards}; alarms: {shown}"


def group_view(group: list[dict]):
    """One group of a step's rollouts: a collapsible block with its prompt, expected answer and a
    table of its completions (reward, advantage, tokens, cut or failed)."""
    from dash import html

    first = group[0]
    rewards = [r["reward"] for r in group]
    spread = max(rewards) - min(rewards)
    answer = first.get("answer")
    summary = (f"group {first.get('group')} · row {first.get('row_id')} · reward mean {sum(rewards) / len(rewards):.3f}, "
               f"spread {spread:.3f}" + (f" · answer {str(answer)[:60]}" if answer not in (None, "") else ""))
    header = html.Tr([html.Th(h, style={"textAlign": "left", "width": w}) for h, w in
                      (("#", "3%"), ("completion", "62%"), ("reward", "8%"), ("advantage", "8%"), ("tokens", "6%"),
                       ("note", "13%"))])
    rows = []
    for i, r in enumerate(group):
        note = (f"{r.get('error_kind')} error: {r.get('error')}" if r.get("error")
                else "cut at max_tokens" if r.get("is_truncated") else "")
        advantage = "" if r.get("advantage") is None else f"{r['advantage']:+.3f}"
        completion = html.Td(html.Pre(completion_text(r.get("completion")), style=PRE), className="completion")
        rows.append(html.Tr([html.Td(str(i)), completion,
                             html.Td(f"{r['reward']:.3f}", className="reward"), html.Td(advantage, className="advantage"),
                             html.Td(str(r.get("completion_tokens", ""))), html.Td(note)], className="rollout"))
    return html.Details([
        html.Summary(summary, style={"cursor": "pointer", "fontWeight": "bold"}),
        html.Div("prompt", style={"fontWeight": "bold", "marginTop": "6px"}),
        html.Pre(message_text(first.get("prompt")), style=PRE, className="prompt"),
        *([html.Div([html.B("expected answer: "), html.Code(str(answer), className="answer")])]
          if answer not in (None, "") else []),
        html.Table([html.Thead(header), html.Tbody(rows)], style={"width": "100%", "borderCollapse": "collapse"}),
    ], open=first.get("group") == 0, className="group", style={"margin": "8px 0", "padding": "6px",
                                                              "border": "1px solid #ddd", "borderRadius": "4px"})


def build_app(run_dirs: list[Path]):
    """The Dash app of the page for ``run_dirs`` (each read once here, then again at every refresh).

    Raises:
        ConfigError: a directory that is not a readable run (one line naming it).
        MissingExtra: Dash is not installed.
    """
    from vf_rl.config.packages import require

    dash = require("dash", "dash", "view", "vf-rl view")
    from dash import Input, Output, dash_table, dcc, html

    runs = load_runs(run_dirs)
    app = dash.Dash("vf-rl-view", title="vf-rl view", serve_locally=True, update_title=None)
    labels = [r.label for r in runs]
    app.layout = html.Div([
        html.H2("vf-rl view"),
        html.Ul(id="runs"),
        html.Div([html.Span("x axis: "), dcc.RadioItems(id="x-axis", value="step", inline=True,
                                                        options=[{"label": " step ", "value": "step"},
                                                                 {"label": " seconds of training", "value": "seconds"}])]),
        html.Div([html.Span("more curves: "),
                  dcc.Dropdown(id="more-metrics", multi=True, placeholder="any other metric of metrics.jsonl")],
                 style={"maxWidth": "700px"}),
        html.Div(id="graphs", style={"display": "grid", "gridTemplateColumns": "repeat(auto-fill, minmax(480px, 1fr))"}),
        html.H3("Resolved configs: what differs"),
        dcc.Checklist(id="all-keys", options=[{"label": " every key", "value": "all"}], value=[]),
        dash_table.DataTable(id="config-table", columns=[{"name": n, "id": n} for n in ["key", *labels]],
                             style_cell={"textAlign": "left", "fontFamily": "monospace", "fontSize": "13px",
                                         "whiteSpace": "normal", "maxWidth": "420px"}, page_size=50),
        html.H3("Rollouts"),
        html.Div([dcc.Dropdown(id="rollout-run", options=labels, value=labels[0], clearable=False,
                               style={"width": "320px"}),
                  dcc.Dropdown(id="rollout-step", clearable=False, placeholder="step", style={"width": "200px"})],
                 style={"display": "flex", "gap": "12px"}),
        html.Div(id="rollouts"),
        dcc.Interval(id="refresh", interval=REFRESH_S * 1000),
    ], style={"fontFamily": "sans-serif", "margin": "12px 24px"})

    def current() -> list[Run]:
        try:
            return load_runs(run_dirs)
        except ConfigError:
            return runs  # a file being rewritten: the last good read

    @app.callback(Output("runs", "children"), Output("more-metrics", "options"), Input("refresh", "n_intervals"))
    def show_runs(_):
        now = current()
        shown = {key for key, _ in PANELS} | {k for r in now for k in r.metric_keys() if k.startswith(HEALTH_PREFIX)}
        others = sorted({k for r in now for k in r.metric_keys()} - shown)
        return [html.Li(run_summary(r), className="run") for r in now], others

    @app.callback(Output("graphs", "children"), Input("x-axis", "value"), Input("more-metrics", "value"),
                  Input("refresh", "n_intervals"))
    def show_graphs(against, more, _):
        now = current()
        health = sorted({k for r in now for k in r.metric_keys() if k.startswith(HEALTH_PREFIX)})
        panels = PANELS + [(k, f"health: {k[len(HEALTH_PREFIX):]}") for k in health] + [(k, k) for k in more or []]
        return [dcc.Graph(id=graph_id(key), figure=figure(now, key, title, against), config={"displaylogo": False})
                for key, title in panels]

    @app.callback(Output("config-table", "data"), Input("all-keys", "value"), Input("refresh", "n_intervals"))
    def show_config(everything, _):
        return config_differences(current(), everything=bool(everything))

    @app.callback(Output("rollout-step", "options"), Output("rollout-step", "value"), Input("rollout-run", "value"),
                  Input("refresh", "n_intervals"), dash.State("rollout-step", "value"))
    def rollout_steps(label, _, chosen):
        run = next(r for r in current() if r.label == label)
        steps = run.rollout_steps()
        options = [{"label": f"step {s}", "value": s} for s in steps]
        return options, chosen if chosen in steps else (steps[-1] if steps else None)

    @app.callback(Output("rollouts", "children"), Input("rollout-run", "value"), Input("rollout-step", "value"))
    def show_rollouts(label, step):
        run = next(r for r in current() if r.label == label)
        if step is None:
            return html.P(f"{run.label} recorded no rollouts (trainer.args.log_rollouts_every = 0, or no step yet).")
        try:
            records = run.rollouts(int(step))
        except ConfigError as exc:
            return html.P(str(exc))
        return [html.P(f"{run.label}, step {step}: {len(records)} rollouts in {len(groups(records))} groups",
                       id="rollouts-title"), *[group_view(g) for g in groups(records)]]

    return app


def check_port(host: str, port: int) -> None:
    """Raise ConfigError when ``host:port`` cannot be listened on (taken, or a host not of this machine)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                              "choose another with --port") from None


USAGE = """vf-rl view RUN_DIR [RUN_DIR ...] [--port N] [--host HOST] [--no-browser]
       vf-rl view -h | --help | --version"""

DESCRIPTION = """\
Open a local web page of one or several runs: their reward, held-out reward, entropy,
completion length, truncation and health alarms (health/<rule>) against the step or the seconds
of training, the runs overlaid; the keys of their resolved configs (RUN_DIR/resolved.toml) that
differ; and the rollouts of any recorded step, group by group: the prompt, the expected answer,
each completion with its reward and advantage. A run records its rollouts after step 1, every
trainer.args.log_rollouts_every steps (default 5) and the last, in RUN_DIR/rollouts/. The page
is served from this process (nothing is fetched from the internet) and reads the runs again every
few seconds, so a run in progress can be watched. Its address is printed; Ctrl-C stops it."""

EPILOG = """\
exit status: 0 stopped with Ctrl-C; 2 bad input (a missing run directory, no metrics.jsonl, a
port that is taken, Dash not installed: pip install 'vf-rl[view]'), in one line."""


def build_parser():
    """The parser of ``vf-rl view``; its help is ``vf-rl view --help``."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser("vf-rl view", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="A run's output directory (output_dir, by default outputs/<run_name>); several are overlaid.")
    parser.add_argument("--port", type=int, default=8050, metavar="N", help="The port to serve the page on (default 8050).")
    parser.add_argument("--host", default="127.0.0.1", metavar="HOST",
                        help="The address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every "
                             "network it is on, with no password).")
    parser.add_argument("--no-browser", action="store_true", help="Do not open the page in a web browser.")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        app = build_app(opts.run_dirs)
        check_port(opts.host, opts.port)
    except ConfigError as exc:
        print(f"vf-rl view: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    url = f"http://{'[' + opts.host + ']' if ':' in opts.host else opts.host}:{opts.port}/"
    print(f"vf-rl view: {url} ({len(opts.run_dirs)} run{'s' if len(opts.run_dirs) > 1 else ''}; Ctrl-C stops it)",
          flush=True)
    if not opts.no_browser:
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    app.logger.setLevel(logging.WARNING)  # no second line with the address
    try:
        app.run(host=opts.host, port=opts.port, debug=False)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
