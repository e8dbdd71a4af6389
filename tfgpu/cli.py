"""Shared argparse for the entrypoints that are not driven by the train flags (doctor, report, benchmark)."""
import argparse
import re

from tfgpu.config import ConfigError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (a ConfigError), not a usage block."""

    def error(self, message):
        named = re.search(r"--?(\w+)", message)
        raise ConfigError(named.group(1) if named else "flags", message)
