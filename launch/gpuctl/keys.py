"""`gpuctl keys`: client keys, authorizing keys on a daemon, and pinning server keys.

create     make this user's client key (once)
show       this user's public key and the pinned server keys
authorize  let a client key into a daemon, as viewer or operator (needs its state dir)
revoke     take a key's access away again
list       the keys a daemon accepts
server     print a daemon's public key, to pin on other machines
trust      pin a remote daemon's public key for its address
forget     drop a node from the known-nodes file
"""

from __future__ import annotations

from pathlib import Path

import click

from gpud.commands.frontend import state_dir_option
from gpud.model.endpoints import DEFAULT_EVENTS_PORT, AddressError, parse_endpoint
from gpud.node.paths import default_state_dir
from gpud.security.auth import authorize, authorized_keys_path, read_authorized_keys, revoke
from gpud.security.keys import (
    CLIENT_KEY,
    KeyFileError,
    check_public_key,
    client_key_dir,
    load_client_keypair,
    load_or_create_client_keypair,
    load_server_public_key,
)
from gpud.security.known_nodes import (
    KnownNode,
    forget_node,
    known_nodes_path,
    load_known_nodes,
    remember_node,
)
from gpud.security.roles import Role
from launch.gpuctl.context import EXIT_FAILED, EXIT_USAGE, Ctl, fail, json_option
from launch.gpuctl.output import emit_json, table


def _state_dir(value: Path | None) -> Path:
    path = (value or default_state_dir()).expanduser()
    if not path.is_dir():
        fail(f"state dir {path} does not exist (has a daemon been started with it?)", EXIT_USAGE)
    return path


def _looks_like_key(arg: str) -> bool:
    try:
        check_public_key(arg)
    except KeyFileError:
        return False
    return True


class KeyArgsCommand(click.Command):
    """A command whose positional keys may begin with "-".

    z85 uses "-" as a digit, so about one key in 85 starts with it and would
    otherwise be read as an option. Such keys are moved behind "--", keeping
    their order after the other positionals, which always come first.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            keys = [a for a in args if a.startswith("-") and _looks_like_key(a)]
            if keys:
                args = [a for a in args if a not in keys] + ["--", *keys]
        return super().parse_args(ctx, args)


def _checked_key(text: str) -> str:
    try:
        return check_public_key(text).decode()
    except KeyFileError as exc:
        fail(str(exc), EXIT_USAGE)


@click.group("keys")
def keys_group() -> None:
    """Client keys, daemon authorization and pinned server keys."""


@keys_group.command("create")
@click.option("--force", is_flag=True, help="Replace an existing key (daemons must re-authorize).")
@json_option
@click.pass_obj
def create_command(ctl: Ctl, force: bool) -> None:
    """Create this user's client key (in $GPUD_CONFIG_DIR/keys) if it does not exist."""
    if force:
        for suffix in (".key", ".key_secret"):
            (client_key_dir() / f"{CLIENT_KEY}{suffix}").unlink(missing_ok=True)
    try:
        pair, created = load_or_create_client_keypair()
    except KeyFileError as exc:
        fail(str(exc), EXIT_USAGE)
    if ctl.json:
        emit_json(
            {"public_key": pair.public_text, "created": created, "dir": str(client_key_dir())}
        )
        return
    click.echo(pair.public_text)
    click.echo(
        f"{'created' if created else 'already existed'}: {client_key_dir()}/{CLIENT_KEY}.key",
        err=True,
    )


@keys_group.command("show")
@json_option
@click.pass_obj
def show_command(ctl: Ctl) -> None:
    """This user's public key and every pinned node key."""
    try:
        pair = load_client_keypair()
        known = load_known_nodes()
    except (KeyFileError, AddressError) as exc:
        fail(str(exc), EXIT_USAGE)
    public = pair.public_text if pair else None
    if ctl.json:
        emit_json({"public_key": public, "dir": str(client_key_dir()), "nodes": known.nodes})
        return
    click.echo(f"client key: {public or '(none yet: gpuctl keys create)'}")
    click.echo(f"known nodes ({known_nodes_path()}):")
    rows = [
        [n.control.removeprefix("tcp://"), n.name, "insecure" if n.insecure else n.server_key]
        for n in known.nodes
    ]
    click.echo(table(["  ADDRESS", "NAME", "SERVER KEY"], [[f"  {r[0]}", *r[1:]] for r in rows]))


@keys_group.command("authorize", cls=KeyArgsCommand)
@click.argument("key")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default=Role.VIEWER.value,
    show_default=True,
    help="viewer reads telemetry and status; operator may also launch, stop and resume.",
)
@click.option("--name", required=True, help="Who the key belongs to (shown in the audit log).")
@state_dir_option
@json_option
@click.pass_obj
def authorize_command(ctl: Ctl, key: str, role: str, name: str, state_dir: Path | None) -> None:
    """Authorize a client public KEY on the daemon that owns a state dir."""
    root = _state_dir(state_dir)
    try:
        changed = authorize(root, _checked_key(key), Role(role), name)
    except (KeyFileError, OSError) as exc:
        fail(str(exc), EXIT_FAILED)
    if ctl.json:
        emit_json({"key": key, "role": role, "name": name, "changed": changed})
    else:
        click.echo(f"{'authorized' if changed else 'already authorized'}: {name} as {role}")


@keys_group.command("revoke", cls=KeyArgsCommand)
@click.argument("key")
@state_dir_option
@json_option
@click.pass_obj
def revoke_command(ctl: Ctl, key: str, state_dir: Path | None) -> None:
    """Revoke a client public KEY on the daemon that owns a state dir."""
    root = _state_dir(state_dir)
    try:
        removed = revoke(root, _checked_key(key))
    except (KeyFileError, OSError) as exc:
        fail(str(exc), EXIT_FAILED)
    if ctl.json:
        emit_json({"key": key, "revoked": removed})
    elif removed:
        click.echo("revoked: its requests are refused within a second, open connections included")
    else:
        fail("that key was not authorized", EXIT_FAILED)


@keys_group.command("list")
@state_dir_option
@json_option
@click.pass_obj
def list_command(ctl: Ctl, state_dir: Path | None) -> None:
    """The client keys a daemon accepts, with their roles."""
    root = _state_dir(state_dir)
    try:
        keys = read_authorized_keys(authorized_keys_path(root))
    except KeyFileError as exc:
        fail(str(exc), EXIT_FAILED)
    if ctl.json:
        emit_json(keys)
        return
    click.echo(table(["ROLE", "NAME", "KEY"], [[k.role.value, k.name, k.key] for k in keys.keys]))


@keys_group.command("server")
@state_dir_option
@json_option
@click.pass_obj
def server_command(ctl: Ctl, state_dir: Path | None) -> None:
    """Print a daemon's public key, to pin with `gpuctl keys trust` elsewhere."""
    root = _state_dir(state_dir)
    try:
        public = load_server_public_key(root).decode()
    except KeyFileError as exc:
        fail(str(exc), EXIT_USAGE)
    if ctl.json:
        emit_json({"server_key": public, "state_dir": str(root)})
    else:
        click.echo(public)


@keys_group.command("trust", cls=KeyArgsCommand)
@click.argument("address")
@click.argument("server_key")
@click.option("--events", "events", help="Events HOST:PORT [same host, port 7712].")
@click.option("--name", help="A name for the node.")
@json_option
@click.pass_obj
def trust_command(
    ctl: Ctl, address: str, server_key: str, events: str | None, name: str | None
) -> None:
    """Pin SERVER_KEY as the key of the daemon at ADDRESS (HOST:PORT)."""
    try:
        control = parse_endpoint(address)
        events_endpoint = parse_endpoint(events, DEFAULT_EVENTS_PORT) if events else None
        remember_node(
            KnownNode(
                control=control,
                events=events_endpoint,
                server_key=_checked_key(server_key),
                name=name,
            )
        )
    except AddressError as exc:
        fail(str(exc), EXIT_USAGE)
    if ctl.json:
        emit_json({"control": control, "events": events_endpoint, "server_key": server_key})
    else:
        click.echo(f"pinned the server key of {address}")


@keys_group.command("forget")
@click.argument("address")
@json_option
@click.pass_obj
def forget_command(ctl: Ctl, address: str) -> None:
    """Drop ADDRESS (and its pinned key) from the known-nodes file."""
    try:
        removed = forget_node(parse_endpoint(address))
    except AddressError as exc:
        fail(str(exc), EXIT_USAGE)
    if ctl.json:
        emit_json({"address": address, "forgotten": removed})
    elif removed:
        click.echo(f"forgot {address}")
    else:
        fail(f"{address} is not in {known_nodes_path()}", EXIT_FAILED)
