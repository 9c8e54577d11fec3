"""A folder of every file a locked environment installs (locks/<name>.txt), for a machine with no
internet: its manifest (name, version, file, sha256, size), written after the download and read
before an offline install. Standard library only: scripts/setup.sh runs it before any environment
exists (``python -m verl_gsm8k.wheelhouse`` from the repository root)."""
