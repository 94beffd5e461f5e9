"""Event Grid's subscription filter, as a small evaluator over an Event Grid schema event: which events a
subscription delivers. It follows "Understand event filtering for Event Grid subscriptions"
(https://learn.microsoft.com/azure/event-grid/event-filtering): event types, subject prefix and suffix,
and advanced filters, all of which must match (the values of one filter are alternatives). String
comparisons ignore case; a key with dots walks into the event (`data.RunTags.x`), its names matched
regardless of case, as the front door reads Azure ML's data; a missing key matches only the negative and
null operators. Only the operators the templates use, and their negations, are implemented."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MISSING = object()


def value_at(event: Mapping[str, Any], key: str) -> Any:
    """The value a filter's key names in `event`, or MISSING."""
    node: Any = event
    for name in key.split("."):
        if not isinstance(node, Mapping):
            return MISSING
        found = {str(k).casefold(): v for k, v in node.items()}
        if name.casefold() not in found:
            return MISSING
        node = found[name.casefold()]
    return node


def _strings(value: Any) -> str | None:
    return value.casefold() if isinstance(value, str) else None


def advanced_filter_matches(event: Mapping[str, Any], advanced: Mapping[str, Any]) -> bool:
    operator, key = advanced["operatorType"], advanced["key"]
    values = [str(v).casefold() for v in advanced.get("values", [])]
    found = value_at(event, key)
    if operator == "IsNotNull":
        return found is not MISSING and found is not None
    if operator == "IsNullOrUndefined":
        return found is MISSING or found is None
    negative = {
        "StringNotIn": "StringIn",
        "StringNotContains": "StringContains",
        "StringNotBeginsWith": "StringBeginsWith",
        "StringNotEndsWith": "StringEndsWith",
    }
    if operator in negative:
        return not advanced_filter_matches(event, {**advanced, "operatorType": negative[operator]})
    text = _strings(found) if found is not MISSING else None
    if text is None:
        return False
    tests = {
        "StringIn": lambda v: text == v,
        "StringContains": lambda v: v in text,
        "StringBeginsWith": text.startswith,
        "StringEndsWith": text.endswith,
    }
    if operator not in tests:
        raise NotImplementedError(f"advanced filter operator {operator!r}")
    return any(tests[operator](v) for v in values)


def delivers(subscription_filter: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether a subscription with this `filter` delivers the (Event Grid schema) event."""
    types = subscription_filter.get("includedEventTypes")
    if types and str(event.get("eventType", "")).casefold() not in {t.casefold() for t in types}:
        return False
    subject = str(event.get("subject", ""))
    if not subscription_filter.get("isSubjectCaseSensitive", False):
        subject = subject.casefold()
        fold = str.casefold
    else:
        fold = str
    begins, ends = subscription_filter.get("subjectBeginsWith"), subscription_filter.get("subjectEndsWith")
    if begins and not subject.startswith(fold(begins)):
        return False
    if ends and not subject.endswith(fold(ends)):
        return False
    return all(advanced_filter_matches(event, f) for f in subscription_filter.get("advancedFilters", []))
