"""Flower's ServerApp and ClientApp for edgetrain fleet (the components of the Flower App that
``edgetrain fleet serve`` writes into RUNDIR and runs with ``flwr run``)."""
from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from . import client as _client
from . import coordinator as _coordinator
from . import wire

server_app = ServerApp()
client_app = ClientApp()


@server_app.main()
def _serve(grid: Grid, context: Context) -> None:
    _coordinator.run(grid, str(context.run_config["edgetrain"]))


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    join = str(context.node_config["edgetrain"])
    config = dict(msg.content.config_records["config"])
    global_arrays = wire.weights_from(msg.content.array_records["arrays"])
    try:
        encoded, metrics, facts = _client.train(join, global_arrays, config)
    except Exception as exc:  # the coordinator sees why (Flower turns it into an error reply)
        import sys

        print(f"Error: round {config.get('round')!s}: {_client.error_text(exc)}", file=sys.stderr, flush=True)
        raise RuntimeError(_client.error_text(exc)) from None
    content = RecordDict({"update": wire.to_record(encoded), "metrics": MetricRecord(metrics),
                          "facts": ConfigRecord(facts)})
    return Message(content=content, reply_to=msg)


@client_app.query()
def _query(msg: Message, context: Context) -> Message:
    config = dict(msg.content.config_records["config"])
    join = str(context.node_config["edgetrain"])
    if config.get("hello"):  # the coordinator asks who this node is (its name and device key)
        return Message(content=RecordDict({"config": ConfigRecord(_client.identity(join))}), reply_to=msg)
    _client.finished(join, config)
    return Message(content=RecordDict({"config": ConfigRecord({"ok": True})}), reply_to=msg)
