from tailscope.cli import main

raise SystemExit(main())
