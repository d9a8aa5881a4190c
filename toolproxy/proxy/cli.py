"""`toolproxy serve`."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import click

from toolproxy.conditions import NAMES, ConditionOptions
from toolproxy.proxy.config import ConfigError, ProxyConfig
from toolproxy.proxy.headers import REDACT_KEY
from toolproxy.proxy.tags import BadTag, parse_tags
from toolproxy.record import keys
from toolproxy.record.masking import KEY_FILE as MASK_KEY
from toolproxy.record.masking import parse_rules
from toolproxy.record.sampling import KEY_FILE as SAMPLE_KEY
from toolproxy.record.sampling import parse_rate
from toolproxy.record.writer import SEGMENT_DIR
from toolproxy.term.quantities import parse_duration, parse_size


def check_condition_options(options: ConditionOptions) -> None:
    """Fail at start, not on the first request, when a template or parser cannot work."""
    if options.parser:
        from toolproxy.calls import FORMATS

        if options.parser not in FORMATS:
            raise click.UsageError(f"--parser {options.parser}: unknown; choose one of {', '.join(FORMATS)}")
    if options.chat_template:
        from toolproxy.conditions.chat_template import TemplateError, cached_template

        try:
            cached_template(options.chat_template)
        except TemplateError as exc:
            raise click.UsageError(f"--chat-template: {exc}") from None


def check_otlp(endpoint: str | None, content: bool) -> None:
    """Fail at start when spans were asked for but cannot be sent."""
    if endpoint is None:
        if content:
            raise click.UsageError("--otlp-content needs --otlp-endpoint")
        return
    from toolproxy.otlp.shipper import missing_sdk, traces_url

    traces_url(endpoint)
    problem = missing_sdk()
    if problem:
        raise click.UsageError(f"--otlp-endpoint: {problem}")


def key_from_env(var: str | None, option: str) -> str | None:
    """An API key named by an environment variable, so it never appears in argv or on disk."""
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise click.UsageError(f"{option} {var}: that environment variable is empty or unset")
    return value


def tags_from_options(tags: tuple[str, ...]) -> dict[str, str]:
    """`--tag KEY=VALUE` options as tags, or a usage error naming the malformed one."""
    try:
        return parse_tags(tags)
    except BadTag as exc:
        raise click.BadParameter(str(exc), param_hint="--tag") from None


def _flag(parse, value: str, option: str):
    """A size or duration flag's value, or a ValueError that names the flag."""
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{option} {exc}") from None


def _upstream_key_env():
    return click.option(
        "--upstream-key-env",
        default=None,
        metavar="VAR",
        help="Environment variable holding the upstream's API key; the proxy sends it itself (it never reaches argv "
        "or disk).",
    )


def upstream_key_option(fn):
    """--upstream-key-env for commands that are not serve, with their old name --api-key-env kept
    as a hidden alias that still works (and says it is deprecated)."""

    @functools.wraps(fn)
    def command(*args, api_key_env=None, **kwargs):
        if api_key_env is not None:
            if kwargs.get("upstream_key_env"):
                raise click.UsageError("give --upstream-key-env only (--api-key-env is its old name)")
            click.echo("toolproxy: --api-key-env is deprecated; use --upstream-key-env", err=True)
            kwargs["upstream_key_env"] = api_key_env
        return fn(*args, **kwargs)

    command = click.option("--api-key-env", default=None, metavar="VAR", hidden=True)(command)
    return _upstream_key_env()(command)


SERVE_OPTIONS = (
    click.option(
        "--upstream",
        required=True,
        envvar="TOOLPROXY_UPSTREAM",
        show_envvar=True,
        help="Model server root, e.g. http://127.0.0.1:11434 (Ollama) or http://127.0.0.1:8080 (llama.cpp).",
    ),
    click.option(
        "--host", default="127.0.0.1", show_default=True, help="Address to listen on. Non-loopback needs --auth-token."
    ),
    click.option("--port", default=8787, show_default=True, type=int, help="Port to listen on (0 picks a free one)."),
    click.option(
        "--data",
        "data_dir",
        default="toolproxy-data",
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Where segments (and later the DuckDB file) go.",
    ),
    click.option(
        "--run",
        default=None,
        help="Run name for requests that carry no run tag; strftime fields are filled in from each request's start in "
        "UTC, so prod-%Y-%m-%d starts a run a day (analyze re-derives a run whole: bound long-lived untagged "
        "traffic).",
    ),
    click.option(
        "--condition",
        type=click.Choice(NAMES),
        default="native",
        show_default=True,
        help="Interface condition for requests that carry no condition tag.",
    ),
    click.option(
        "--stack",
        default=None,
        help="Serving stack (ollama, llamacpp, vllm, sglang, lmstudio, llama-cpp-python, openai) when fingerprinting "
        "cannot tell.",
    ),
    click.option(
        "--chat-template",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="Jinja chat template for --condition template.",
    ),
    click.option("--parser", default=None, help="Tool-call parser for --condition template (e.g. hermes)."),
    click.option(
        "--constrained-forced",
        is_flag=True,
        help="Constrained schema without a final-answer branch (the original study's variant, where an episode cannot "
        "end by answering).",
    ),
    click.option(
        "--bridge",
        default=None,
        metavar="PROTOCOLS",
        help="Translate these protocols (responses, messages, gemini; comma-separated) to chat completions for an "
        "upstream that only speaks chat, and the replies back.",
    ),
    click.option("--max-body", default="64MiB", show_default=True, help="Largest request body accepted (413 above)."),
    click.option(
        "--max-response",
        default="256MiB",
        show_default=True,
        help="Largest response body passed on and recorded: one announced larger gets 502, one that grows larger is "
        "cut there (the client sees a truncated response); recorded as response_too_large either way.",
    ),
    click.option(
        "--spill-above",
        default="1MiB",
        show_default=True,
        help="Request and response bodies larger than this wait in a temporary file under --data instead of memory.",
    ),
    click.option(
        "--connect-timeout", default=10.0, show_default=True, type=float, help="Seconds to connect to the upstream."
    ),
    click.option(
        "--ttfb-timeout",
        default=600.0,
        show_default=True,
        type=float,
        help="Seconds to wait for the upstream's response to begin (CPU models read long prompts slowly).",
    ),
    click.option(
        "--idle-timeout",
        default=300.0,
        show_default=True,
        type=float,
        help="Longest gap in seconds between two chunks of a response.",
    ),
    click.option(
        "--total-timeout", default=None, type=float, help="Cap in seconds on a whole exchange (default: none)."
    ),
    click.option(
        "--durability",
        type=click.Choice(["group", "sync"]),
        default="group",
        show_default=True,
        help="group: fsync in groups every --commit-window; sync: a response's last byte waits for its record's fsync.",
    ),
    click.option("--commit-window", default=0.2, show_default=True, type=float, help="Seconds between group fsyncs."),
    click.option(
        "--on-record-failure",
        type=click.Choice(["serve", "block"]),
        default="serve",
        show_default=True,
        help="serve: keep forwarding and count dropped records; block: answer 503 while recording fails.",
    ),
    click.option("--segment-size", default="64MiB", show_default=True, help="Rotate segment files at this size."),
    click.option(
        "--auth-token",
        envvar="TOOLPROXY_AUTH_TOKEN",
        show_envvar=True,
        default=None,
        help="Clients must present this token (X-Toolproxy-Token header, or as their API key).",
    ),
    _upstream_key_env(),
    click.option("--insecure-public", is_flag=True, help="Allow a non-loopback --host without --auth-token."),
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        metavar="NAME",
        envvar="TOOLPROXY_ALLOWED_HOSTS",
        show_envvar=True,
        help="A name (or IP) clients reach this proxy by, besides localhost and the --host address: requests whose "
        "Host, or whose browser Origin on a POST, names anything else are refused 403 (against DNS rebinding "
        "and cross-site pages). Repeatable; '*' turns the checks off.",
    ),
    click.option("--quiet", is_flag=True, help="No line per exchange."),
    click.option(
        "--upstream-connections",
        default=0,
        show_default=True,
        type=int,
        help="Cap on connections to the upstream; 0: as many as clients need. Time a request waits for one under a "
        "cap is recorded (pool_wait_ms) and shown in stats.",
    ),
    click.option(
        "--client-header-timeout",
        default=15.0,
        show_default=True,
        type=float,
        help="Seconds a client has to send a complete request head after connecting or after its previous response; "
        "idle connections close then too.",
    ),
    click.option(
        "--client-body-timeout",
        default=60.0,
        show_default=True,
        type=float,
        help="Longest pause in seconds while a client sends its request body (408 after).",
    ),
    click.option(
        "--retain",
        default=None,
        metavar="DURATION",
        help="Delete recorded segments last written longer ago than this (90s, 12h, 7d, 2w), continuously; see "
        "`toolproxy prune`.",
    ),
    click.option(
        "--max-disk", default=None, metavar="SIZE", help="Keep the recorded segments under SIZE (e.g. 20GiB)."
    ),
    click.option(
        "--on-disk-full",
        type=click.Choice(["prune", "block"]),
        default="prune",
        show_default=True,
        help="At --max-disk, prune: delete the oldest closed segments; block: delete nothing and answer 503.",
    ),
    click.option(
        "--mask",
        multiple=True,
        metavar="PATTERN",
        help="Mask matches in recorded bodies, object keys included (never in what the client receives): a regular "
        "expression in RE2 syntax (linear time: no backreferences or lookarounds), or a built-in set: email, "
        "api-key, credit-card, ipv4 (repeatable).",
    ),
    click.option(
        "--sample",
        default=None,
        metavar="RATE",
        help="Record this share of episodes (0.1, 25%), each kept or dropped whole; the others are forwarded as "
        "always and only counted. Reports scale counts by it.",
    ),
    click.option(
        "--no-live-page", is_flag=True, help="No /_toolproxy/ page, and no classifying of exchanges as they pass."
    ),
    click.option(
        "--no-fingerprint",
        is_flag=True,
        help="Do not probe the upstream's own endpoints (at start and per new model) to record which stack and "
        "version it is.",
    ),
    click.option(
        "--otlp-endpoint",
        default=None,
        metavar="URL",
        envvar="TOOLPROXY_OTLP_ENDPOINT",
        show_envvar=True,
        help="Send one OpenTelemetry span per exchange (GenAI conventions) to this OTLP/HTTP receiver, e.g. "
        "http://127.0.0.1:4318; sent in batches off the request path, dropped and counted when it cannot keep "
        "up.",
    ),
    click.option(
        "--otlp-content",
        is_flag=True,
        help="Put prompts, replies, tool definitions and tool-call arguments on the spans too (sensitive; off by "
        "default).",
    ),
)


def serve_options(fn):
    """Every serve flag, for the commands that start a proxy themselves (serve, run, study)."""
    for option in reversed(SERVE_OPTIONS):
        fn = option(fn)
    return fn


def harness_serve_options(fn):
    """Serve's flags for commands that run a harness behind an in-process proxy (a free port by default)."""
    fn = serve_options(fn)
    for param in fn.__click_params__:
        if param.name == "port":
            param.default = 0
    return fn


def config_from_options(
    upstream,
    host,
    port,
    data_dir,
    run,
    condition,
    stack,
    chat_template,
    parser,
    constrained_forced,
    bridge,
    max_body,
    max_response,
    spill_above,
    connect_timeout,
    ttfb_timeout,
    idle_timeout,
    total_timeout,
    durability,
    commit_window,
    on_record_failure,
    segment_size,
    auth_token,
    upstream_key_env,
    insecure_public,
    allowed_hosts,
    quiet,
    upstream_connections,
    client_header_timeout,
    client_body_timeout,
    retain,
    max_disk,
    on_disk_full,
    mask,
    sample,
    no_live_page,
    no_fingerprint,
    otlp_endpoint,
    otlp_content,
) -> ProxyConfig:
    """Serve's flags -> a validated ProxyConfig, or a usage error that names the flag."""
    upstream_key = key_from_env(upstream_key_env, "--upstream-key-env")
    try:
        from toolproxy.conditions.bridge import parse_families

        options = ConditionOptions(
            stack=stack,
            chat_template=chat_template,
            parser=parser,
            constrained_forced=constrained_forced,
            bridge=parse_families(bridge) if bridge is not None else frozenset(),
        )
        config = ProxyConfig(
            upstream=upstream,
            data_dir=data_dir,
            host=host,
            port=port,
            run=run,
            condition=condition,
            condition_options=options,
            max_body=_flag(parse_size, max_body, "--max-body"),
            max_response=_flag(parse_size, max_response, "--max-response"),
            spill_above=_flag(parse_size, spill_above, "--spill-above"),
            connect_timeout=connect_timeout,
            ttfb_timeout=ttfb_timeout,
            idle_timeout=idle_timeout,
            total_timeout=total_timeout,
            durability=durability,
            commit_window=commit_window,
            on_record_failure=on_record_failure,
            segment_bytes=_flag(parse_size, segment_size, "--segment-size"),
            auth_token=auth_token,
            upstream_key=upstream_key,
            insecure_public=insecure_public,
            allowed_hosts=tuple(allowed_hosts),
            quiet=quiet,
            fingerprint=not no_fingerprint,
            live_page=not no_live_page,
            upstream_connections=upstream_connections,
            client_header_timeout=client_header_timeout,
            client_body_timeout=client_body_timeout,
            retain_seconds=_flag(parse_duration, retain, "--retain") if retain is not None else None,
            max_disk=_flag(parse_size, max_disk, "--max-disk") if max_disk is not None else None,
            on_disk_full=on_disk_full,
            mask=mask,
            sample=_flag(parse_rate, sample, "--sample") if sample is not None else None,
            otlp_endpoint=otlp_endpoint,
            otlp_content=otlp_content,
        )
        parse_rules(mask)
        check_otlp(otlp_endpoint, otlp_content)
    except (ConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    check_condition_options(options)
    return config


def make_data_dir(config: ProxyConfig) -> None:
    segments = config.data_dir / SEGMENT_DIR
    try:
        segments.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.UsageError(f"--data {config.data_dir}: cannot create {segments}: {exc.strerror or exc}") from None
    # Keys are created now, so a bad key file is a usage error, not a failure at start, and every
    # worker of `--workers N` finds the same one.
    for flag, wanted, name in (
        ("--data", True, REDACT_KEY),
        ("--mask", config.mask, MASK_KEY),
        ("--sample", config.sample is not None, SAMPLE_KEY),
    ):
        if wanted:
            try:
                keys.load_key(config.data_dir, name)
            except (OSError, ValueError) as exc:
                raise click.UsageError(f"{flag}: cannot use the key {name} in {config.data_dir}: {exc}") from None


@click.command()
@serve_options
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Processes sharing the port (SO_REUSEPORT), each with its own writer; stats and health answer for all. One "
    "process uses about one core.",
)
def serve(workers, **options):
    """Forward to one upstream model server and record every exchange."""
    config = config_from_options(**options)
    make_data_dir(config)
    from toolproxy.proxy.workers import raise_fd_limit, run_workers

    raise_fd_limit()  # inherited by the workers
    if workers > 1:
        raise SystemExit(run_workers(config, workers))
    from toolproxy.proxy.server import run as run_proxy

    run_proxy(config)
