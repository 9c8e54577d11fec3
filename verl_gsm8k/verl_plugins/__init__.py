"""Modules verl imports in every process when VERL_USE_EXTERNAL_MODULES names them."""
