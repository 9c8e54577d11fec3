import sys

from verl_gsm8k.launch.cli import main

sys.exit(main())
