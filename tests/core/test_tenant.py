"""The tenant of a request: a hash of the credential it carries, the same key in any slot."""

from __future__ import annotations

from app.core.dialects import DIALECTS
from app.core.endpoints import AUTHORIZATION, KeySlot
from app.core.tenant import ANONYMOUS, credential_in, key_hash, tenant_of

GEMINI_SLOTS = DIALECTS["gemini"].key_slots
MESSAGES_SLOTS = DIALECTS["messages"].key_slots


def test_a_request_without_a_key_is_anonymous() -> None:
    assert tenant_of([("content-type", "application/json")], "", (AUTHORIZATION,)) == ANONYMOUS
    assert tenant_of([("authorization", "   ")], "", (AUTHORIZATION,)) == ANONYMOUS
    assert tenant_of([], "alt=sse", GEMINI_SLOTS) == ANONYMOUS


def test_the_tenant_is_a_hash_never_the_key() -> None:
    tenant = tenant_of([("Authorization", "Bearer sk-alice")], "", (AUTHORIZATION,))
    assert tenant == key_hash("sk-alice") != ANONYMOUS
    assert "sk-alice" not in tenant and tenant.startswith("t") and len(tenant) == 33
    assert tenant != tenant_of([("Authorization", "Bearer sk-bob")], "", (AUTHORIZATION,))


def test_the_same_key_in_any_slot_is_the_same_tenant() -> None:
    bearer = tenant_of([("authorization", "Bearer sk-same")], "", MESSAGES_SLOTS)
    header = tenant_of([("X-Api-Key", "sk-same")], "", MESSAGES_SLOTS)
    in_query = tenant_of([], "alt=sse&key=sk-same", GEMINI_SLOTS)
    google = tenant_of([("x-goog-api-key", "sk-same")], "", GEMINI_SLOTS)
    assert bearer == header == in_query == google == key_hash("sk-same")


def test_the_first_slot_that_holds_a_key_decides() -> None:
    headers = [("authorization", "Bearer second"), ("x-api-key", "first")]
    assert credential_in(headers, "", MESSAGES_SLOTS) == "first"
    assert credential_in(headers, "", (AUTHORIZATION,)) == "second"


def test_a_value_its_slot_cannot_read_counts_whole() -> None:
    # Another scheme is forwarded as it is: the upstream sees it, so it tells clients apart.
    basic = "Basic dXNlcjpwdw=="
    assert credential_in([("authorization", basic)], "", (AUTHORIZATION,)) == basic


def test_query_keys_are_decoded_and_matched_by_name_only() -> None:
    slot = KeySlot("key", in_query=True)
    assert credential_in([], "monkey=x&key=a%2Bb", (slot,)) == "a+b"
    assert credential_in([], "keys=x", (slot,)) is None
