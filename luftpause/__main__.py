from luftpause.cli import main

raise SystemExit(main())
