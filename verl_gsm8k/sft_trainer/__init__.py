"""The trainer the SFT recipe runs: verl's ``SFTTrainer`` with the PPO recipes' stop on SIGTERM.

    torchrun ... -m verl_gsm8k.sft_trainer --config-path configs --config-name gsm8k_sft [k=v ...]

``__main__.py`` is verl's ``sft_trainer`` entry (the same Hydra config, the same process group
set-up) building ``StoppableSFTTrainer`` (``stoppable.py``) instead of verl's class. verl's SFT
entry builds its trainer by name and has no registry, so a small entry module of our own is the
extension point, as verl's own experimental mains do for PPO. Nothing is imported here.
"""
