"""The device check (`bash scripts/device_check.sh`): what only a GPU can show, its stages in
one folder; `device_check.run` is the command."""
