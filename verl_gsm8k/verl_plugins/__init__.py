"""Modules verl imports in every process when named in VERL_USE_EXTERNAL_MODULES
(the launcher (verl_gsm8k/launch/) names them): the CPU platform and the flash-attention fallback.

Nothing is imported here: each module is loaded by its own name.
"""
