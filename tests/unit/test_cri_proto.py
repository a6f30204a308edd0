"""The CRI v1 proto: the committed generated code is what scripts/gen-proto produces, and the wire contract
(package, services, a sample of field numbers from every area) is the Kubernetes one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cri_server.api.v1 import api_pb2 as pb

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATED = ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]


def test_generated_code_is_current(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run([os.path.join(TOP, "scripts", "gen-proto"), str(tmp_path)], check=True,
                   env={**os.environ, "PYTHON": sys.executable})
    for name in GENERATED:
        fresh = (tmp_path / "cri_server" / "api" / "v1" / name).read_bytes()
        committed = open(os.path.join(TOP, "cri_server", "api", "v1", name), "rb").read()
        assert fresh == committed, f"cri_server/api/v1/{name} is stale: run scripts/gen-proto"


def test_package_and_services():
    fd = pb.DESCRIPTOR
    assert fd.package == "runtime.v1"
    runtime = fd.services_by_name["RuntimeService"]
    image = fd.services_by_name["ImageService"]
    assert runtime.full_name == "runtime.v1.RuntimeService"
    assert image.full_name == "runtime.v1.ImageService"
    assert len(runtime.methods) == 35
    assert [m.name for m in image.methods] == ["ListImages", "StreamImages", "ImageStatus", "PullImage",
                                                "RemoveImage", "ImageFsInfo"]
    events = runtime.methods_by_name["GetContainerEvents"]
    assert events.input_type.name == "GetEventsRequest" and events.output_type.name == "ContainerEventResponse"


@pytest.mark.parametrize("message,field,number", [
    ("PodSandboxConfig", "linux", 8),
    ("LinuxSandboxSecurityContext", "run_as_group", 8),
    ("LinuxSandboxSecurityContext", "supplemental_groups_policy", 11),
    ("LinuxContainerSecurityContext", "run_as_group", 12),
    ("LinuxContainerSecurityContext", "seccomp", 15),
    ("LinuxContainerSecurityContext", "seccomp_profile_path", 10),
    ("ContainerConfig", "CDI_devices", 17),
    ("ContainerConfig", "stop_signal", 18),
    ("ContainerStatus", "image_id", 17),
    ("ContainerStatus", "stop_signal", 19),
    ("Mount", "uidMappings", 6),
    ("Mount", "image_sub_path", 10),
    ("ImageSpec", "user_specified_image", 18),
    ("ImageSpec", "image_ref", 20),
    ("LinuxContainerResources", "memory_swap_limit_in_bytes", 10),
    ("PodSandboxStatusResponse", "timestamp", 4),
    ("StatusResponse", "features", 4),
    ("PsiStats", "Full", 1),
    ("ContainerStats", "io", 6),
    ("UpdatePodSandboxResourcesRequest", "resources", 3),
])
def test_field_numbers(message, field, number):
    assert pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].number == number


def test_enums():
    assert pb.CgroupDriver.Value("SYSTEMD") == 0 and pb.CgroupDriver.Value("CGROUPFS") == 1
    assert pb.Signal.Value("SIGTERM") == 23 and pb.Signal.Value("SIGRTMAX") == 65
    assert pb.SecurityProfile.ProfileType.Value("Localhost") == 2
    assert pb.NamespaceMode.Value("TARGET") == 3
    assert pb.ContainerState.Value("CONTAINER_UNKNOWN") == 3


def test_redacted_credentials():
    f = pb.AuthConfig.DESCRIPTOR.fields_by_name["password"]
    assert f.GetOptions().debug_redact
