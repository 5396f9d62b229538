"""``sparkgate cost-table list | show VERSION | revert``: the versioned cost tables of a running controller.

``list`` prints every stored table's provenance and marks the ones the fleet
serves now; ``show`` prints one table as SGLang loads it; ``revert`` sends the
fleet back to its static tables at once (an operator decision in the ledger,
refused outside adaptive).
"""

from __future__ import annotations

import json

import click

from .commands import _call, controller_option, operator_command


@click.group("cost-table")
def cost_table() -> None:
    """The controller's versioned cost tables."""


@cost_table.command("list")
@controller_option
@click.option("--json", "as_json", is_flag=True, help="One JSON list instead of a table.")
def listed(url, as_json):
    """Every stored table: version, group, parent, source, fit figures; '*' marks the ones served now."""
    entries = _call("GET", url, "/v1/cost-tables")
    status = _call("GET", url, "/v1/status")
    assert isinstance(entries, list) and isinstance(status, dict)
    served = set(status.get("cost_tables", {}).values())
    # A group with no fitted table in force serves its static table.
    groups = set(status.get("cost_tables", {}))
    for e in entries:
        e["served"] = e["version"] in served or (e["source"] == "static" and e["replica_group"] not in groups)
    if as_json:
        click.echo(json.dumps(entries))
        return
    click.echo(f"{'':1} {'version':<48} {'parent':<48} {'source':<7} {'steps':>6} {'err parent':>10} {'err new':>8}")
    for e in entries:
        errors = [f"{e[k]:.1%}" if e[k] is not None else "-" for k in ("error_parent", "error_candidate")]
        click.echo(
            f"{'*' if e['served'] else ' '} {e['version']:<48} {e['parent'] or '-':<48} {e['source']:<7} "
            f"{e['fitted_steps'] or '-':>6} {errors[0]:>10} {errors[1]:>8}"
        )


@cost_table.command("show")
@controller_option
@click.argument("version")
def show(url, version):
    """One table as JSON (the layout SGLang loads, with sparkgate's meta)."""
    click.echo(json.dumps(_call("GET", url, f"/v1/cost-tables/{version}"), indent=2))


cost_table.add_command(
    operator_command(
        "revert",
        "Serve the static tables again now; adaptive continues on them, without fitted tables.",
        "revert_table",
    )
)
