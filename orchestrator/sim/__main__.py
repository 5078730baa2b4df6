"""Entry point: `python -m orchestrator.sim <sglang.launch_server flags>` or `... serve MODEL <vllm serve flags>`
(spawned workers never run this)."""

import sys

if __name__ == "__main__":
    # Here, above both modes: vllm_server builds on server, so server must not pick vllm_server itself.
    if sys.argv[1:2] == ["serve"]:
        from orchestrator.sim.vllm_server import main as vllm_main

        sys.exit(vllm_main(sys.argv[2:]))
    from orchestrator.sim.server import main

    sys.exit(main())
