"""``python -m gpuprof`` runs the command-line interface."""

from gpuprof.cli import main

if __name__ == "__main__":
    main()
