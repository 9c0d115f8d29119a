"""One reading of a memory size everywhere (eagle_eval/units.py): the table of spellings, each read as the
bytes its unit defines (written here from the definitions: GB = 10^9, GiB = 2^30) or refused with the
accepted forms listed; and every option that takes a size reads it through that one function."""

import pytest

from eagle_eval.units import FORMS, SizeError, parse_size, spell_size

READ = [
    ("141GB", 141 * 10**9), ("141 GB", 141 * 10**9), ("1.5GB", 1_500_000_000), ("2TB", 2 * 10**12),
    ("500kB", 500_000), ("500KB", 500_000), ("64MB", 64 * 10**6),
    ("80GiB", 80 * 2**30), ("80 GiB", 80 * 2**30), ("80GIB", 80 * 2**30), ("512MiB", 512 * 2**20),
    ("4KiB", 4096), ("1TiB", 2**40), ("79.5GiB", 79 * 2**30 + 2**29), ("0.3KiB", 307),     # 307.2: the fraction dropped
    ("20000B", 20000), (" 80GiB ", 80 * 2**30),
]
REFUSED = [
    ("80gb", "a lower-case 'b' means bits, not bytes (accelerate reads 80Gb as 10 GB); for bytes write 80GB"),
    ("80Gb", "for bytes write 80GB"), ("80gib", "for bytes write 80GiB"), ("70 mb", "for bytes write 70MB"),
    ("80", "a bare number has no unit"), ("1.5", "a bare number has no unit"),
    ("1.5B", "not a whole number of bytes"),
    ("-1GB", "not a size"), ("1e3GB", "not a size"), ("lots", "not a size"), ("", "not a size"), ("GB", "not a size"),
    ("80 G", "not a size"), ("80GiBs", "not a size"),
    ("0GiB", "not a positive size"), ("0", "not a positive size"),
    ("2000000TiB", "more than 1 EiB"),
]


@pytest.mark.parametrize("text, expected", READ)
def test_a_size_is_read_as_its_unit_defines(text, expected):
    assert parse_size(text, "--gpu-memory") == expected


@pytest.mark.parametrize("text, said", REFUSED)
def test_a_spelling_that_could_be_misread_is_refused_with_the_forms(text, said):
    with pytest.raises(SizeError) as err:
        parse_size(text, "--gpu-memory")
    assert str(err.value).startswith(f"--gpu-memory {text!r}: ")
    assert said in str(err.value) and str(err.value).endswith(f"; write {FORMS}")


def test_zero_only_where_allowed():
    assert parse_size("0", "--reserve", allow_zero=True) == parse_size("0GiB", "--reserve", allow_zero=True) == 0
    with pytest.raises(SizeError, match="not a positive size"):
        parse_size("0MB", "--gpu-memory")


@pytest.mark.parametrize("n, down, up", [(141 * 10**9, "131GiB", "132GiB"), (1000, "1000B", "1000B"),
                                         (5 * 2**20, "5MiB", "5MiB"), (3 * 2**40 + 1, "3072GiB", "3073GiB"),
                                         (1, "1B", "1B")])
def test_a_written_size_reads_back_never_zero(n, down, up):
    assert (spell_size(n), spell_size(n, up=True)) == (down, up)
    assert parse_size(down, "x") <= n <= parse_size(up, "x")
    with pytest.raises(ValueError):
        spell_size(0)


@pytest.mark.parametrize("text, expected", [("80GiB", 80 * 2**30), ("1.5GB", 1_500_000_000), ("80gb", "bits"),
                                            ("80", "bare number"), ("0GiB", "not a positive size")])
def test_every_option_that_takes_a_size_reads_it_the_same_way(text, expected):
    """plan's --gpu-memory and --reserve, and each device of --max-memory (run and the others: handed to
    accelerate as bytes): the same bytes, or the same refusal."""
    from eagle_eval.models.target import TargetError, parse_max_memory
    from eagle_eval.settings import ConfigError, PlanOptions

    if isinstance(expected, int):
        assert parse_max_memory(f"0={text},cpu={text}") == {0: expected, "cpu": expected}
        PlanOptions(target="x", gpu_memory=text, reserve=text)
        return
    with pytest.raises(TargetError, match=expected):
        parse_max_memory(f"0={text}")
    with pytest.raises(ConfigError, match=expected):
        PlanOptions(target="x", gpu_memory=text)
    if text != "0GiB":                                 # --reserve may be zero
        with pytest.raises(ConfigError, match=expected):
            PlanOptions(target="x", reserve=text)
