"""The signed references in the gateway's compaction items: only the issued string validates, only
for the tenant it was issued to, only with the key it was signed with."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.agents import refs as compaction_refs

secrets = st.binary(min_size=16, max_size=64)
tenants = st.text(min_size=1, max_size=40)
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/"


@st.composite
def issued(draw: st.DrawFn) -> tuple[bytes, str, str, str]:
    secret, tenant = draw(secrets), draw(tenants)
    # an id as new_id makes one, from drawn bytes: the data must not depend on os.urandom
    ref_id = compaction_refs._b64(
        draw(st.binary(min_size=compaction_refs.ID_BYTES, max_size=compaction_refs.ID_BYTES))
    )
    return secret, tenant, ref_id, compaction_refs.sign(secret, tenant, ref_id)


def test_new_ids_differ() -> None:
    assert len({compaction_refs.new_id() for _ in range(100)}) == 100


@given(issued())
def test_an_issued_reference_validates_for_its_tenant(case: tuple[bytes, str, str, str]) -> None:
    secret, tenant, ref_id, content = case
    assert compaction_refs.is_ours(content)
    assert compaction_refs.verify(secret, tenant, content) == ref_id


@given(issued(), st.data())
def test_a_tampered_reference_never_validates(
    case: tuple[bytes, str, str, str], data: st.DataObject
) -> None:
    secret, tenant, _, content = case
    position = data.draw(st.integers(0, len(content) - 1))
    replacement = data.draw(st.sampled_from(ALPHABET).filter(lambda c: c != content[position]))
    cut = data.draw(st.integers(0, len(content)))
    extra = data.draw(st.text(ALPHABET, min_size=1, max_size=8))
    tampered = [
        content[:position] + replacement + content[position + 1 :],  # one character changed
        content[:cut] + extra + content[cut:],  # characters inserted
        content[:cut] + content[cut + 1 :],  # a character removed
    ]
    for candidate in tampered:
        if candidate != content:
            assert compaction_refs.verify(secret, tenant, candidate) is None


@given(issued(), tenants, secrets)
def test_another_tenant_or_key_never_validates(
    case: tuple[bytes, str, str, str], other_tenant: str, other_secret: bytes
) -> None:
    secret, tenant, _, content = case
    if other_tenant != tenant:
        assert compaction_refs.verify(secret, other_tenant, content) is None
    if other_secret != secret:
        assert compaction_refs.verify(other_secret, tenant, content) is None


@given(st.text(max_size=120), secrets, tenants)
def test_an_arbitrary_string_never_validates(text: str, secret: bytes, tenant: str) -> None:
    assert compaction_refs.verify(secret, tenant, text) is None
    assert compaction_refs.verify(secret, tenant, compaction_refs.PREFIX + text) is None
