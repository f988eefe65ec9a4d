"""Parsers and validators of the WSL bridge, against the real output formats of wsl.exe, netsh,
PowerShell and Linux's /proc/net/tcp."""

from __future__ import annotations

import subprocess

import pytest

from wslm.wsl_bridge import elevated, firewall, netinfo, portproxy, ports, wsl
from wslm.wsl_bridge.errors import ValidationError
from wslm.wsl_bridge.linux_quote import quote_for_wsl
from wslm.wsl_bridge.validate import validate_distro, validate_port

WSL_LIST = ("  NAME                   STATE           VERSION\r\n"
            "* Ubuntu-22.04           Running         2\r\n"
            "  docker-desktop         Stopped         2\r\n"
            "  Legacy                 Stopped         1\r\n")


@pytest.mark.parametrize("encoding,ending,bom", [("utf-16-le", "\r\r\n", b""), ("utf-16-le", "\r\n", b"\xff\xfe"),
                                                  ("utf-8", "\r\n", b""), ("utf-8", "\n", b"")])
def test_wsl_list_any_encoding_and_line_ending(encoding: str, ending: str, bom: bytes) -> None:
    data = bom + WSL_LIST.replace("\r\n", ending).encode(encoding)
    distros = wsl.parse_wsl_list(data)
    assert [(d.name, d.state, d.version, d.default) for d in distros] == [
        ("Ubuntu-22.04", "Running", 2, True), ("docker-desktop", "Stopped", 2, False), ("Legacy", "Stopped", 1, False)]
    assert distros[0].running and not distros[1].running


def test_wsl_list_localised_state_with_spaces() -> None:
    text = "  NAME      STATUS              VERSION\r\n* Ubuntu    Wird ausgeführt     2\r\n"
    [d] = wsl.parse_wsl_list(text.encode("utf-16-le"))
    assert (d.name, d.state, d.version) == ("Ubuntu", "Wird ausgeführt", 2)


def test_wslconfig_mode() -> None:
    assert wsl.parse_wslconfig_mode("[wsl2]\nmemory=8GB\nnetworkingMode=mirrored\n") == "mirrored"
    assert wsl.parse_wslconfig_mode("[WSL2]\nnetworkingmode = \"NAT\"\n") == "nat"
    assert wsl.parse_wslconfig_mode("[experimental]\nnetworkingMode=mirrored\n") is None
    assert wsl.parse_wslconfig_mode("not an ini [") is None


def test_ip_addr_uses_eth0_inet() -> None:
    out = "2: eth0    inet 172.29.144.7/20 brd 172.29.159.255 scope global eth0\\       valid_lft forever\n"
    assert wsl.parse_ip_addr(out) == "172.29.144.7"
    assert wsl.parse_ip_addr("") is None


PORTPROXY = ("\r\nListen on ipv4:             Connect to ipv4:\r\n\r\n"
             "Address         Port        Address         Port\r\n"
             "--------------- ----------  --------------- ----------\r\n"
             "0.0.0.0         8000        172.20.1.2      8000\r\n"
             "192.168.1.23    2222        wslhost         22\r\n\r\n")


def test_portproxy_table() -> None:
    from wslm.wsl_bridge.winexec import decode_output

    rules = portproxy.parse_v4tov4(decode_output(PORTPROXY.encode()))
    assert rules == [portproxy.ProxyRule("0.0.0.0", 8000, "172.20.1.2", 8000),
                     portproxy.ProxyRule("192.168.1.23", 2222, "wslhost", 22)]
    assert portproxy.parse_v4tov4("") == []


def test_excluded_port_ranges() -> None:
    text = ("\r\nProtocol tcp Port Exclusion Ranges\r\n\r\nStart Port    End Port\r\n----------    --------\r\n"
            "      1025        1124\r\n     50000       50059     *\r\n\r\n* - Administered port exclusions.\r\n")
    ranges = ports.parse_excluded_ranges(text)
    assert ranges == [(1025, 1124), (50000, 50059)]
    assert ports.excluded_range_for(1100, ranges) == (1025, 1124)
    assert ports.excluded_range_for(8000, ranges) is None


RULE_JSON = ('{"Name":"wslm-share-8000","DisplayName":"wslm-share-8000","Enabled":"True","Direction":"Inbound",'
             '"Action":"Allow","Profile":"Private","Protocol":"TCP","LocalPort":"8000","RemoteAddress":"LocalSubnet"}')


def test_firewall_rule_json_single_object_list_or_nothing() -> None:
    [rule] = firewall.parse_rule_list(RULE_JSON + "\r\n")
    assert rule == firewall.FirewallRule(name="wslm-share-8000", port=8000, profile="private", remoteip="localsubnet",
                                         enabled=True, direction="in", action="allow", protocol="TCP")
    assert rule.matches(firewall.FirewallRule("wslm-share-8000", 8000))
    assert not rule.matches(firewall.FirewallRule("wslm-share-8000", 8000, profile="private,public"))
    assert firewall.parse_rule_list("") == [] and firewall.parse_rule_list("\r\n") == []
    # A rule an older wslm made with netsh: a GUID Name, wslm's name only as DisplayName.
    guid = "{0B5C2E4A-1F2D-4C3B-9A8E-7D6C5B4A3F21}"
    legacy = RULE_JSON.replace('"Name":"wslm-share-8000"', f'"Name":"{guid}"').replace(
        '"Profile":"Private"', '"Profile":"Domain, Private"').replace("8000", "9000")
    foreign = RULE_JSON.replace("wslm-share-8000", "Remote Desktop").replace('"Name":"Remote Desktop"',
                                                                             f'"Name":"{guid.lower()}"')
    rules = firewall.parse_rule_list(f"[{RULE_JSON},{legacy},{foreign}]")
    assert [(r.name, r.port, r.legacy_id, r.profile) for r in rules] == [
        ("wslm-share-8000", 8000, "", "private"), ("wslm-share-9000", 9000, guid, "domain,private")]


def test_firewall_argv_are_what_the_helper_allows(monkeypatch) -> None:
    monkeypatch.setattr(firewall.winexec, "windows_tool", lambda name: rf"C:\Windows\System32\{name}")
    rule = firewall.FirewallRule("wslm-share-8000", 8000)
    add = firewall.add_argv(rule)
    assert add[-1] == ("$ErrorActionPreference='Stop'; New-NetFirewallRule -Name 'wslm-share-8000' "
                       "-DisplayName 'wslm-share-8000' -Direction Inbound -Action Allow -Protocol TCP -LocalPort 8000 "
                       "-Profile Private -RemoteAddress LocalSubnet -Enabled True | Out-Null")
    legacy = firewall.FirewallRule("wslm-share-8000", 8000, profile="domain,private", remoteip="192.168.1.0/24",
                                   legacy_id="{0B5C2E4A-1F2D-4C3B-9A8E-7D6C5B4A3F21}")
    for argv in (add, firewall.delete_argv("wslm-share-8000"), firewall.remove_argv(legacy),
                 firewall.restore_argv(legacy), firewall.add_argv(legacy)):
        assert elevated.command_allowed(argv), argv
    assert "Remove-NetFirewallRule" in firewall.remove_argv(legacy)[-1]
    for bad in (firewall.FirewallRule("wslm-x", 1, remoteip="-Foo"), firewall.FirewallRule("wslm-x", 1, profile="x"),
                firewall.FirewallRule("wslm-x", 1, remoteip="1.2.3.4;calc"), firewall.FirewallRule("wslm x", 1)):
        with pytest.raises(ValidationError):
            firewall.add_argv(bad)
    with pytest.raises(ValidationError):
        firewall.remove_argv(firewall.FirewallRule("wslm-x", 1, legacy_id="{x}' ; calc ; '"))
    assert firewall.restore_argv(firewall.FirewallRule("wslm-x", 0)) is None  # no single port: cannot re-create


def test_hyperv_json_single_object_or_list() -> None:
    one = '{"Name":"wslm-share-8000","LocalPorts":"8000","Direction":"Inbound","Action":"Allow"}'
    assert firewall.parse_hyperv_list(one) == [firewall.HyperVRule("wslm-share-8000", 8000)]
    assert len(firewall.parse_hyperv_list(f"[{one},{one.replace('8000', '9000')}]")) == 2
    assert firewall.parse_hyperv_list("") == []


def test_network_json_filters_virtual_and_maps_categories() -> None:
    text = ('{"addresses":{"InterfaceAlias":"Ethernet","IPAddress":"10.0.0.5","AddressState":"Preferred"},'
            '"profiles":{"InterfaceAlias":"Ethernet","NetworkCategory":"0"}}')
    [addr] = netinfo.parse_network_json(text)
    assert (addr.address, addr.category) == ("10.0.0.5", "Public")
    assert netinfo.public_profile_warnings([addr])
    text = ('{"addresses":[{"InterfaceAlias":"vEthernet (WSL)","IPAddress":"172.20.0.1"},'
            '{"InterfaceAlias":"Wi-Fi","IPAddress":"169.254.3.4"},{"InterfaceAlias":"Wi-Fi","IPAddress":"192.168.0.9",'
            '"AddressState":"Tentative"}],"profiles":[]}')
    assert netinfo.parse_network_json(text) == []


def test_proc_net_tcp_listeners() -> None:
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
           "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1\n"
           "   1: 00000000:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2\n"
           "   2: 0100007F:1F42 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 3\n")
    tcp6 = ("  sl  local_address                         remote_address                        st\n"
            "   0: 00000000000000000000000000000000:1F43 00000000000000000000000000000000:0000 0A 0\n"
            "   1: 0000000000000000FFFF00000100007F:1F44 00000000000000000000000000000000:0000 0A 0\n")
    assert ports.parse_proc_net_tcp(tcp + tcp6) == [("127.0.0.1", 8000), ("0.0.0.0", 8001), ("::", 8003),
                                                    ("127.0.0.1", 8004)]


@pytest.mark.parametrize("bad", [0, 65536, -1, "80a", "", None, 8.5, True])
def test_bad_ports_rejected(bad: object) -> None:
    with pytest.raises(ValidationError) as err:
        validate_port(bad)
    assert err.value.fix


@pytest.mark.parametrize("bad", ["Ubuntu; rm -rf /", "a b", "$(x)", "", "-d", "x" * 65, "Ub`u`", "Ubuntu\n"])
def test_bad_distro_names_rejected(bad: str) -> None:
    with pytest.raises(ValidationError):
        validate_distro(bad)


def test_quote_for_wsl_words_have_no_whitespace() -> None:
    for arg in ["plain", "trailing\n", "a b", "it's", 'say "hi"', "$HOME", "x;y|z&", "tab\there", "new\nline", "", "é ü"]:
        word = quote_for_wsl(arg)
        assert not any(ch.isspace() for ch in word), word
        # POSIX/bash parse of the word gives back the argument.
        got = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True).stdout.decode()
        assert got == arg, (arg, word, got)
    with pytest.raises(ValidationError):
        quote_for_wsl("nul\x00byte")


def test_elevated_helper_allow_list() -> None:
    netsh, ps = r"C:\Windows\System32\netsh.exe", r"C:\Windows\System32\WindowsPowerShell\v1.0\powershell.exe"
    assert elevated.command_allowed([netsh, "interface", "portproxy", "add", "v4tov4", "listenport=8000",
                                     "listenaddress=0.0.0.0", "connectport=8000", "connectaddress=172.20.1.2"])
    assert elevated.command_allowed([netsh, "advfirewall", "firewall", "delete", "rule", "name=wslm-share-8000"])
    assert not elevated.command_allowed([netsh, "advfirewall", "firewall", "delete", "rule", "name=Remote Desktop"])
    assert not elevated.command_allowed([netsh, "advfirewall", "reset"])
    assert not elevated.command_allowed(["netsh.exe", "interface", "portproxy", "reset"])
    assert not elevated.command_allowed([r"C:\Windows\System32\cmd.exe", "/c", "whoami"])
    assert not elevated.command_allowed([ps, "-NoProfile", "-NonInteractive", "-Command", "Remove-Item C:\\ -Recurse"])
    assert not elevated.command_allowed([netsh, "interface", "portproxy", "add", "v4tov4", "listenport=1 & calc"])
    head = [ps, "-NoProfile", "-NonInteractive", "-Command", "$ErrorActionPreference='Stop'; "]
    for script in ("Remove-NetFirewallRule -Name 'Remote Desktop'", "Remove-NetFirewallRule -Name '*'",
                   "Get-NetFirewallRule -Name '{0B5C2E4A-1F2D-4C3B-9A8E-7D6C5B4A3F21}' | Remove-NetFirewallRule",
                   "New-NetFirewallRule -Name 'wslm-a' -DisplayName 'wslm-a' -Direction Inbound -Action Allow "
                   "-Protocol TCP -LocalPort 80 -Profile Any -RemoteAddress Any -Enabled True | Out-Null; calc"):
        assert not elevated.command_allowed(head[:4] + [head[4] + script]), script
