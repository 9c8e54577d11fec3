from verl_gsm8k.wheelhouse import main

raise SystemExit(main())
