"""What the ``discover_capabilities`` meta-tool hands back to the model."""

from __future__ import annotations

from typing import Any

from capdisc.agents.answers import metatool_result

CAPS = [
    {
        "id": "tool:stripe-refund",
        "kind": "tool",
        "name": "stripe-refund",
        "relevance": 0.7,
        "available": True,
        "score": 6.1,
        "description": "Refunds a charge.",
    }
]
TIERS = {
    "tier0": "Available capability categories: ...",
    "tier1": "Relevant capabilities:",
    "tier2": "# Stripe - Refund",
}


def answer(**changes: Any) -> dict[str, Any]:
    return {
        "capabilities": CAPS,
        "tiers": TIERS,
        "total_indexed": 98,
        "index_version": 7,
        "abstained": False,
        **changes,
    }


def test_found_capabilities_come_back_with_tier_1_and_2_details_only() -> None:
    result = metatool_result(answer())

    assert result["capabilities"] == [
        {
            "id": "tool:stripe-refund",
            "kind": "tool",
            "name": "stripe-refund",
            "relevance": 0.7,
            "available": True,
        }
    ]
    assert result["details"] == "Relevant capabilities:\n\n# Stripe - Refund"
    assert (result["total_indexed"], result["index_version"]) == (98, 7)
    assert "workflow_guidance" not in result


def test_workflow_hints_come_back_as_guidance() -> None:
    result = metatool_result(answer(workflow_hints={"finance": "Confirm the amount first."}))

    assert result["workflow_guidance"] == {"finance": "Confirm the amount first."}


def test_an_abstained_answer_says_nothing_fits() -> None:
    result = metatool_result(answer(abstained=True, capabilities=[]))

    assert result["capabilities"] == []
    assert "No registered capability fits" in result["note"]
