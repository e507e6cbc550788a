"""CloudFormation, as far as the local stack needs it: `template.py` reads template.yaml
(short-form tags, nested applications expanded), `resources.py` creates its resources on the moto
server and resolves intrinsics to them."""
