"""dcgm-exporter's default counters (verbatim copies in tests/data/dcgm-exporter/) and the
check that a scrape of gpud's `/metrics` carries them under the same names and types, so
the two exporters cannot drift apart (issue 24 §4).

A row of dcgm-exporter's CSVs is `FIELD, type, help`; a row commented out is a field it
knows but leaves off by default. Every field it exports by default must be in the scrape
with its type (`label` rows: a label on every GPU series), unless NOT_EXPORTED says why
gpud leaves it out; a field gpud exports from the commented rows must have their type too.
The text is read line by line, not with prometheus-client's parser, which renames a
counter's samples to `..._total` and so cannot tell dcgm-exporter's form from its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "dcgm-exporter"
CSVS = ("default-counters.csv", "dcp-metrics-included.csv")

#: The fields dcgm-exporter exports by default that gpud deliberately does not, and why.
#: Any other one missing from a scrape fails the check.
NOT_EXPORTED: dict[str, str] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": (
        "whether an NVIDIA vGPU guest holds its software license: nothing to do with"
        " training, and a constant 0 (DCGM's reading) on the bare-metal and passed-through"
        " GPUs gpud samples"
    ),
}

_ROW = re.compile(r"#?\s*(DCGM_\w+)\s*,\s*(gauge|counter|label)\s*,")
_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? \S+")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class CsvField:
    name: str
    type: str  # gauge, counter or label
    enabled: bool  # False: commented out, which dcgm-exporter leaves off by default
    where: str  # file:line


def csv_fields() -> list[CsvField]:
    found = []
    for csv in CSVS:
        for number, line in enumerate((DATA / csv).read_text().splitlines(), 1):
            row = _ROW.match(line.strip())
            if row:
                enabled = not line.lstrip().startswith("#")
                found.append(CsvField(row[1], row[2], enabled, f"{csv}:{number}"))
    return found


def dcgm_types() -> dict[str, str]:
    """Each field's type in dcgm-exporter: an enabled row's where there is one (the PCIe
    byte fields are also there commented out, as counters of another meaning)."""
    types: dict[str, str] = {}
    for row in sorted(csv_fields(), key=lambda row: row.enabled):
        types[row.name] = row.type
    return types


@dataclass(frozen=True)
class Scrape:
    """A 0.0.4 text exposition as written: `# TYPE` lines and samples by their own name."""

    types: dict[str, str]
    samples: dict[str, list[dict[str, str]]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        types: dict[str, str] = {}
        samples: dict[str, list[dict[str, str]]] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types[name] = kind
            elif line and not line.startswith("#"):
                sample = _SAMPLE.fullmatch(line)
                assert sample, f"not a sample line: {line!r}"
                samples.setdefault(sample[1], []).append(dict(_LABEL.findall(sample[2] or "")))
        return cls(types, samples)


def parity_problems(text: str, absent: Mapping[str, str] | None = None) -> list[str]:
    """What in the scrape `text` differs from dcgm-exporter's default counters; [] when
    nothing does. `absent`: fields this scrape's GPUs do not offer, with why (a GPU without
    NVLink, say): they must then be absent, never 0."""
    absent = absent or {}
    scrape = Scrape.parse(text)
    problems = []
    gpu_series = [labels for name, each in scrape.samples.items() if name.startswith("DCGM_")
                  for labels in each]  # fmt: skip
    if not gpu_series:
        return ["no DCGM_* series at all"]
    rows = csv_fields()
    for name, wanted in dcgm_types().items():
        enabled = any(row.enabled for row in rows if row.name == name)
        if wanted == "label":
            unlabelled = sum(1 for labels in gpu_series if not labels.get(name))
            if enabled and unlabelled:
                problems.append(f"{name}: not a label on {unlabelled} GPU series")
            continue
        if name in scrape.types:
            if scrape.types[name] != wanted:
                problems.append(f"{name}: {scrape.types[name]}, dcgm-exporter's is {wanted}")
            if not scrape.samples.get(name):
                problems.append(f"{name}: typed but no sample of that name")
            if name in NOT_EXPORTED or name in absent:
                problems.append(f"{name}: exported, yet listed as left out")
        elif enabled and name not in NOT_EXPORTED and name not in absent:
            problems.append(f"{name}: dcgm-exporter exports it by default; gpud does not")
    for name in set(NOT_EXPORTED) | set(absent):
        if name not in dcgm_types():
            problems.append(f"{name}: listed as left out, but not in dcgm-exporter's CSVs")
    return problems
