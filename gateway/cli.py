"""The `compactgate` command: run the gateway, check a config, hash a gateway key, convert a
LiteLLM proxy config, show what the gateway would send for a request, print an agent's settings
for a running gateway, or watch it work in an offline demo."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .config import Config, ConfigError, default_config, load_config
from .devtools.commands import check, hash_key, import_litellm
from .devtools.setup import add_parser as add_setup_parser
from .version import version

CONFIG_ENV = "COMPACTGATE_CONFIG"
HTTP = "httptools"  # uvicorn's HTTP/1.1 implementation (uvicorn[standard])


def build_parser() -> argparse.ArgumentParser:
    """The `compactgate` argument parser (also used by tests that check deploy/ entrypoints)."""
    parser = argparse.ArgumentParser(prog="compactgate", description=__doc__)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    # Operators read defaults in --help rather than in the source: every subcommand shows them.
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_DefaultsParser)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help=f"YAML/JSON config (default: ${CONFIG_ENV}, else built-in)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="proxy port")
    serve.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="worker processes on the one port; several share state through the store "
        "(a memory store: each keeps its own, refused when the config needs sharing)",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn and gateway log level")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight responses may take to finish",
    )

    check = commands.add_parser("check-config", help="validate a config and summarise it")
    check.add_argument("path")

    commands.add_parser(
        "hash-key",
        help="read an API key from stdin, print its auth.keys entry (key_sha256: ...)",
        description="Reads a gateway API key from stdin (prompted, unechoed, on a terminal) and "
        "prints the `key_sha256: <hex>` line for an entry of the config's auth.keys list. "
        "The key itself never needs to be in the config.",
    )

    convert = commands.add_parser(
        "import-litellm",
        help="convert a LiteLLM proxy config (model_list) into this gateway's config",
        description="Reads a LiteLLM proxy config and writes this gateway's YAML: one model per "
        "model_name, several deployments of a name as its upstreams (weight from weight, rpm or "
        "tpm), os.environ/X as ${X}. What has no equivalent is named on stderr.",
    )
    convert.add_argument("path", help="the LiteLLM config.yaml")
    convert.add_argument("-o", "--output", help="write the config here (default: stdout)")

    plan = commands.add_parser("plan", help="show what the gateway would send for a request body")
    plan.add_argument(
        "file", help="a request body (JSON): chat completions, responses or anthropic messages"
    )
    plan.add_argument(
        "--api",
        choices=("chat", "responses", "messages"),
        help="the body's API (default: guessed from its shape)",
    )
    plan.add_argument("--config", help=f"config (default: ${CONFIG_ENV}, else built-in)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    add_setup_parser(commands)
    demo = commands.add_parser("demo", help="see the gateway work, offline")
    demo.add_argument("--llm", action="store_true", help="use a real local model (optional extra)")
    demo.add_argument("--turns", type=int, default=14, help="conversation turns to play")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows real defaults only: `(default: None)` on an optional path or `(default: False)` on a
    flag says nothing an operator can use."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _DefaultsParser(argparse.ArgumentParser):
    """A subcommand parser whose --help shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check-config":
        return check(args.path, _served_config)
    if args.command == "hash-key":
        return hash_key()
    if args.command == "import-litellm":
        return import_litellm(args.path, args.output)
    if args.command == "plan":
        from .devtools.plan_cli import run_plan

        return run_plan(args.file, _config_or_exit(args.config), as_json=args.json, api=args.api)
    if args.command == "setup":
        from .devtools.setup import run_setup

        return run_setup(
            args.agent, args.gateway, model=args.model, write=args.write, force=args.force
        )
    from .devtools.demo import run_demo

    return run_demo(llm=args.llm, turns=args.turns)


def _config_or_exit(path: str | None) -> Config:
    path = path or os.environ.get(CONFIG_ENV)
    try:
        return _served_config(path)
    except ConfigError as error:
        print(f"invalid config {path}:", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(1) from None


def _served_config(path: str | None) -> Config:
    """The config a served gateway runs (`path`, else the default): nothing is embedded in a
    served gateway, so an `in_process` upstream is a problem here."""
    from .upstream.in_process import unserved

    config = load_config(path) if path else default_config()
    problems = unserved(config, {})
    if problems:
        raise ConfigError(problems)
    return config


def _serve(args: argparse.Namespace) -> int:
    # uvicorn stops accepting, lets in-flight responses finish (up to --shutdown-timeout), runs
    # the lifespan shutdown, then re-raises the SIGTERM it caught: this handler makes that (and
    # a SIGTERM during start-up) a clean exit 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    import uvicorn

    from .http import connections
    from .http.admin import exposure_warning
    from .http.auth import open_relay_warning
    from .ops.logs import configure_logging
    from .ops.memory import IdleTrim
    from .ops.workers import plan_workers

    path = args.config or os.environ.get(CONFIG_ENV)
    config = _config_or_exit(path)  # fail fast, before any worker starts
    log_config = configure_logging(args.log_level, config.server.log_format)
    plan = plan_workers(config, args.workers)
    if plan.problems:
        print("\n".join(plan.problems), file=sys.stderr)
        return 2
    logging.getLogger("compactgate.serve").info("workers: %s", plan.line)
    for warning in (
        open_relay_warning(config, args.host, os.environ),
        exposure_warning(config.server, args.host),
    ):
        if warning:
            logging.getLogger("compactgate.serve").warning(warning)
    raise_open_files_limit(config.server.max_open_files)
    if path:
        os.environ[CONFIG_ENV] = os.path.abspath(path)
    options = dict(
        host=args.host,
        port=args.port,
        loop="uvloop",
        http=connections.protocol(HTTP, config.server.header_read_timeout_s, IdleTrim()),
        log_level=args.log_level,
        log_config=log_config,  # every worker logs in the configured format
        access_log=False,
        timeout_graceful_shutdown=args.shutdown_timeout,
        ws_max_size=config.server.max_body_bytes,  # a WebSocket request frame: the body limit
    )
    if args.workers > 1:
        _multiprocess_metrics_dir()
    if config.server.admin_port is None:
        if args.workers > 1:
            uvicorn.run("gateway.app:create_app", factory=True, workers=args.workers, **options)
        else:
            from .app import build_app

            uvicorn.run(build_app(config), **options)
        return 0
    return _serve_two_ports(args, config, options)


def raise_open_files_limit(wanted: int | None) -> tuple[int, int]:
    """Set this process's soft RLIMIT_NOFILE to `wanted`, else to the hard limit; returns the
    (soft, hard) limits in force afterwards. Each proxied stream holds two descriptors (client and
    upstream), so the usual 1,024 caps a worker near 500 streams. Workers inherit the limit. Never
    fails: a limit the system refuses is logged and the current one kept."""
    import resource

    log = logging.getLogger("compactgate.serve")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if wanted is not None else hard
    if target == resource.RLIM_INFINITY:
        target = _system_max_open_files()
    if target == soft:
        return soft, hard
    new_hard = hard if hard == resource.RLIM_INFINITY else max(hard, target)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, new_hard))
    except (ValueError, OSError) as error:
        log.warning(
            "open files: could not set the soft limit from %d to %d (hard limit %d): %s",
            soft,
            target,
            hard,
            error,
        )
        return soft, hard
    log.info("open files: soft limit set from %d to %d (hard limit %d)", soft, target, new_hard)
    return target, new_hard


def _system_max_open_files() -> int:
    """The kernel's ceiling for RLIMIT_NOFILE when the hard limit is unlimited (Linux)."""
    try:
        with open("/proc/sys/fs/nr_open") as ceiling:
            return int(ceiling.read())
    except (OSError, ValueError):
        return 1 << 20


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve_two_ports(args: argparse.Namespace, config: Config, options: dict) -> int:
    """The proxy on --port, admin surfaces on server.admin_port: one app, two sockets."""
    import socket

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    sockets = []
    for port in (args.port, config.server.admin_port):
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, port))
        sock.listen(2048)  # connections queue until uvicorn accepts them
        sock.set_inheritable(True)
        sockets.append(sock)
    announcement = (
        f"CompactGate listening on http://{args.host}:{args.port} (proxy), "
        f"admin surfaces on port {config.server.admin_port}"
    )
    options = {k: v for k, v in options.items() if k not in ("host", "port")}
    if args.workers > 1:
        uv_config = uvicorn.Config(
            "gateway.app:create_app", factory=True, workers=args.workers, **options
        )
        _announce(announcement, config.server.log_format)
        Multiprocess(uv_config, sockets=sockets).run()  # each worker runs its own Server
    else:
        from .app import build_app

        server = uvicorn.Server(uvicorn.Config(build_app(config), **options))
        _announce(announcement, config.server.log_format)  # once the app is built: ready
        server.run(sockets=sockets)
    return 0


def _announce(text: str, log_format: str) -> None:
    """A line on stdout whatever the log level (scripts wait for it), in the log's format."""
    if log_format == "json":
        from .ops.logs import JsonFormatter

        record = logging.LogRecord("compactgate.serve", logging.INFO, "", 0, text, None, None)
        text = JsonFormatter().format(record)
    print(text, flush=True)


def _multiprocess_metrics_dir() -> None:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        import tempfile

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="compactgate-metrics-")


if __name__ == "__main__":
    raise SystemExit(main())
