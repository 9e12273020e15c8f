"""The importers' shared translation table: a failed lookup is a typed error naming the table,
the key and close keys, which are looked for only on a miss."""

import pytest

from shardplan.errors import UnsupportedOpError
from shardplan.importers._build import TranslationTable


def test_rule_returns_the_entry_without_looking_for_similar_keys():
    table: TranslationTable[str, int] = TranslationTable("demo table")
    table.register("aten.mm.default")(1)

    def similar():
        raise AssertionError("similar keys are looked for only on a miss")

    assert table.rule("aten.mm.default", similar) == 1


def test_a_missing_rule_names_the_table_the_key_and_similar_keys():
    table: TranslationTable[str, int] = TranslationTable("demo table")
    with pytest.raises(
        UnsupportedOpError,
        match=r"demo table: no rule for 'aten.bmm'; similar: "
        r"\['aten.mm'\]",
    ):
        table.rule("aten.bmm", lambda: ["aten.mm"])
    with pytest.raises(UnsupportedOpError, match=r"no rule for 'aten.bmm'$"):
        table.rule("aten.bmm", lambda: [])
