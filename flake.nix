{
  description = "hetero_nn: task-based heterogeneous CNN training runtime (StarPU-style codelets, Dask underneath)";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.11";
    flake-utils.url = "github:numtide/flake-utils";
  };

  outputs = { self, nixpkgs, flake-utils }:
    flake-utils.lib.eachDefaultSystem (system:
      let
        pkgs = import nixpkgs {
          inherit system;
          config.allowUnfree = true; # torch-bin, only in the `torch` shell
        };
        python = pkgs.python311;

        # The package and its `hetero-nn` entry point (pyproject.toml's [project.scripts]).
        hetero-nn = python.pkgs.buildPythonApplication {
          pname = "hetero-nn";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ python.pkgs.setuptools ];
          dependencies = with python.pkgs; [
            numpy
            numba
            dask
            distributed
            threadpoolctl
            tqdm
          ];
          pythonImportsCheck = [ "hetero_nn" ];
          doCheck = false; # the tests need the shared datasets and PyTorch; run them in the dev shell
        };
      in
      {
        packages.default = hetero-nn;
        packages.hetero-nn = hetero-nn;

        apps.default = {
          type = "app";
          program = "${hetero-nn}/bin/hetero-nn";
        };

        devShells.default = import ./shell.nix { inherit pkgs; };
        devShells.torch = import ./shell.nix { inherit pkgs; withTorch = true; };
      });
}
