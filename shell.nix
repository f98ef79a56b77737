# Development shell for hetero_nn, for `nix-shell` (and reused by flake.nix's devShell).
#
#   nix-shell                          # Python 3.11 with the runtime and test packages
#   nix-shell --arg withTorch true     # plus PyTorch (CPU wheel), for the comparison tests
#
# Inside, the checkout is on PYTHONPATH (no `pip install -e .` into the Nix store),
# `hetero-nn` runs the CLI from the checkout, and HETERO_NN_DATA defaults to the
# git-ignored datasets/data/ that datasets/download.py fills.
{ pkgs ? import <nixpkgs> { config.allowUnfree = true; }
, withTorch ? false
}:

let
  python = pkgs.python311;
  pythonEnv = python.withPackages (ps:
    [
      ps.numpy
      ps.numba
      ps.dask
      ps.distributed
      ps.threadpoolctl
      ps.tqdm
      ps.matplotlib
      ps.pytest
      ps.hypothesis
    ]
    ++ pkgs.lib.optionals withTorch [ ps.torch-bin ]);
in
pkgs.mkShell {
  name = "hetero-nn-dev";
  packages = [ pythonEnv pkgs.git ];
  shellHook = ''
    export PYTHONPATH="$PWD''${PYTHONPATH:+:$PYTHONPATH}"
    export HETERO_NN_DATA="''${HETERO_NN_DATA:-$PWD/datasets/data}"
    hetero-nn() { python -c 'import sys; from hetero_nn.cli import main; sys.exit(main())' "$@"; }
  '';
}
