"""Run in a fresh process whose `sys.path` puts another azure-functions first: import the root entry as the
worker does (its start-up reads the app settings from the environment), index its functions once
(`app.get_functions()`), and invoke each Event Grid function with the events read as JSON from stdin
(`[[function name, event], ...]`), each handed over as the worker hands it under the library loaded.

Prints one JSON object: the azure-functions version and file loaded, the indexed functions' bindings, what
each invocation raised (None when it returned), and the front door's ledger afterwards."""

from __future__ import annotations

import inspect
import json
import sys
import typing

import azure.functions as func
from azure.functions.meta import Datum


def handed_over(event: dict, handler) -> object:
    """What the worker hands `handler`'s Event Grid parameter, by the worker's own rule
    (azure-functions-python-worker, functions.py): annotated `str` or `bytes` on a binding without implicit
    output, the generic binding passes the JSON text through; any other annotation takes the converter of
    the azure-functions loaded (which, before 1.25, turns a CloudEvents delivery into an EventGridEvent
    without its type, source and time)."""
    text = json.dumps(event)
    parameter = next(iter(inspect.signature(handler).parameters))
    converter = func.get_binding_registry().get("eventGridTrigger")
    if typing.get_type_hints(handler).get(parameter) in (str, bytes) and not converter.has_implicit_output():
        return text
    return converter.decode(Datum(text, "json"), trigger_metadata={})


def main() -> None:
    deliveries = json.load(sys.stdin)
    import function_entry
    from function_app import runtime

    indexed = {function.get_function_name(): function for function in function_entry.app.get_functions()}
    raised = []
    for name, event in deliveries:
        handler = indexed[name].get_user_function()
        try:
            handler(handed_over(event, handler))
            raised.append(None)
        except Exception as error:  # reported to the test, which names it
            raised.append(f"{type(error).__name__}: {error}")
    report = {
        "version": func.__version__,
        "file": func.__file__,
        "bindings": {name: [b.type for b in f.get_bindings()] for name, f in indexed.items()},
        "raised": raised,
        "ledger": runtime.front_door().ledger_snapshot(),
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
