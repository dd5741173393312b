#!/usr/bin/env bash
# The wheels the GPU machine's Python (3.12, x86-64; it has torch, transformers, triton, pandas, pyarrow, typer,
# rich, nvidia-ml-py, psutil) lacks for `loopeval run`, downloaded into the git-ignored .whl/ that travels with a
# device call; bench/gpu_run.sh installs them there with --no-deps. Versions are constraints.txt's, the ones the
# tests ran with.
#
#     bash scripts/gpu_wheels.sh          # then: du -sh .whl (a device call carries at most 64 MiB in all)
#
# WHEELS is what a `loopeval run` of a zoo model on the synthetic suite imports (sys.modules at exit, mapped to
# their distributions) that the GPU image does not hold: LightEval and what it imports at load (inspect-ai,
# datasets, nltk, pydantic, ...), the store (sqlalchemy, alembic, mako) and the report (plotly). Pure-Python
# wheels are py3-none-any; the compiled ones (pydantic-core, mmh3, zstandard, ...) are the cp312 manylinux builds.
# FLOORS are small packages the image holds at a version not known here, which the wheels need at some minimum
# (textual: rich>=14.2; inspect-ai: anyio>=4.14.2, fsspec<=2026.6; lighteval: typer>=0.20): brought at the tested
# version, they shadow the image's (pyarrow, which datasets wants >=24, is too large to bring: env.txt names it).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    aenum alembic annotated-types antlr4-python3-runtime boto3 botocore chardet dataproperty datasets dill
    docstring-parser gitdb gitpython httpcore2 httpx2 ijson inspect-ai jmespath jsonlines jsonpatch jsonpointer
    latex2sympy2-extended lighteval mako math-verify mbstrdecoder mmh3 multiprocess nest-asyncio2 nltk pathvalidate
    platformdirs plotly pydantic pydantic-core pytablewriter python-dotenv pytz s3transfer semver shortuuid smmap
    sniffio sqlalchemy starlette tabledata tcolorpy tenacity textual truststore typepy typing-inspection
    zipfile-zstd zstandard
)
FLOORS=(anyio click fsspec rich typer)
py=${PYTHON:-python3}
pins=()
for name in "${WHEELS[@]}" "${FLOORS[@]}"; do  # NAME==VERSION from constraints.txt (its spelling may use _ or . for -)
    pin=$(grep -i -E "^${name//-/[-_.]}==" constraints.txt) || { echo "scripts/gpu_wheels.sh: $name is not pinned in constraints.txt" >&2; exit 2; }
    pins+=("$pin")
done
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do platforms+=(--platform "${tag}_x86_64"); done
rm -rf .whl  # afresh: one version of each (two stop the install), and no wheel trimmed twice
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"
# Two wheels carry what loopeval never runs, over half of the whole: inspect-ai its sandbox binaries and web viewer,
# botocore the API models of every AWS service (it is imported through inspect-ai, never asked for a client).
"$py" - .whl inspect_ai/binaries/ inspect_ai/_view/dist/ botocore/data/ <<'TRIM'
"""Rewrite a wheel without the files under the given folders (and their RECORD lines); botocore keeps data/*.json."""
import sys, zipfile
from pathlib import Path
folder, drop = Path(sys.argv[1]), tuple(sys.argv[2:])
def dropped(name):
    return name.startswith(drop) and not (name.startswith("botocore/data/") and name.count("/") == 2)
for wheel in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(wheel) as old:
        names = [info for info in old.infolist() if not dropped(info.filename)]
        if len(names) == len(old.infolist()):
            continue
        trimmed = wheel.with_suffix(".trimmed")
        with zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as new:
            for info in names:
                data = old.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = "\n".join(line for line in lines if not dropped(line.split(",")[0])).encode() + b"\n"
                new.writestr(info, data)
    trimmed.replace(wheel)
TRIM
du -b .whl/*.whl | sort -n | awk '{total += $1; printf "%8.2f MiB  %s\n", $1 / 2^20, $2} END {printf "%8.2f MiB  in all (a device call carries at most 64)\n", total / 2^20}'
