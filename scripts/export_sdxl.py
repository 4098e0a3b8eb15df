#!/usr/bin/env python3
"""Export SDXL models, VAEs, ControlNets and IP-Adapters into the folders sdxl-batch loads.

The command users run; `export_sdxl.py --help` lists the sources, the options and the files
each export writes (docs/models-and-export.md). The code is the package scripts/export/:
export/cli.py parses the flags and hands the work to one module per export kind.
"""
import sys

from export.cli import main  # scripts/, this file's folder, is on sys.path when it runs

if __name__ == "__main__":
    sys.exit(main())
