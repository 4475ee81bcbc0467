//! The bad-input cases of host-device. The device of the valid config is the node's `vbi0` (the veth to the pod),
//! moved in as `net1`: every case must fail before or undo the move.

use super::*;

pub(crate) fn host_device_base(rig: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "host-device", "device": HOST_VETH,
        "dataDir": rig.state.join("host-device"),
        "ipam": {"type": "static", "addresses": [{"address": "10.78.0.5/24"}]}})
}

pub(crate) fn host_device_cases(rig: &Rig) -> Vec<Case> {
    let base = host_device_base(rig);
    let bare = with(&base, "device", Value::Null);
    let add = |name: &str, key: &str, value: Value, code: u64, needle: &str| {
        Case::conf(name, "ADD", &with(&bare, key, value), code).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    // Its route case fails after the interface is made: the device goes back with its address and up state.
    cases.extend(pod_interface_cases(&base));
    cases.extend([
        Case::conf("no selector", "ADD", &bare, INVALID_CONFIG).needle("specify either"),
        add("device that does not exist", "device", json!("no-such-dev"), INTERNAL, "no-such-dev"),
        add("device with a slash", "device", json!("../vbi0"), INVALID_CONFIG, "device"),
        add("device of 16 bytes", "device", json!("abcdefghijklmnop"), INVALID_CONFIG, "device"),
        add("device a number", "device", json!(7), INVALID_CONFIG, "device"),
        add("device lo", "device", json!("lo"), INVALID_CONFIG, "loopback"),
        add("hwaddr not a MAC", "hwaddr", json!("zz:zz"), INVALID_CONFIG, "MAC"),
        add("hwaddr no device has", "hwaddr", json!("02:de:ad:be:ef:01"), INTERNAL, "02:de:ad:be:ef:01"),
        add("kernelpath relative", "kernelpath", json!("sys/devices/x"), INVALID_CONFIG, "/sys/devices/"),
        add("kernelpath outside /sys/devices", "kernelpath", json!("/etc"), INVALID_CONFIG, "/sys/devices/"),
        add("kernelpath leaving by ..", "kernelpath", json!("/sys/devices/../../etc"), INVALID_CONFIG, "/sys/devices/"),
        add(
            "kernelpath that does not exist",
            "kernelpath",
            json!("/sys/devices/no/such"),
            INTERNAL,
            "/sys/devices/no/such",
        ),
        add("pciBusID ..", "pciBusID", json!(".."), INVALID_CONFIG, "pciBusID"),
        add("pciBusID with a slash", "pciBusID", json!("0000:00/../x"), INVALID_CONFIG, "pciBusID"),
        add("pciBusID of no device", "pciBusID", json!("0000:ff:1f.7"), INTERNAL, "0000:ff:1f.7"),
        add("deviceID of no device", "runtimeConfig", json!({"deviceID": "0000:ff:1f.7"}), INVALID_CONFIG, "DeviceID"),
        add("deviceID ..", "runtimeConfig", json!({"deviceID": ".."}), INVALID_CONFIG, "deviceID"),
        Case::conf("ipam type hostile", "ADD", &with(&base, "ipam/type", json!("../static")), INVALID_CONFIG),
        Case::conf("ipam refuses", "ADD", &with(&base, "ipam/addresses", json!([{"address": "x"}])), INVALID_CONFIG)
            .needle("CIDR"),
        Case::conf("dataDir relative", "ADD", &with(&base, "dataDir", json!("var/lib/cni")), INVALID_CONFIG)
            .needle("dataDir"),
    ]);
    cases
}

#[test]
fn host_device() {
    let rig = Rig::new();
    // The data directory is bookkeeping that stays once made; the cases judge the records in it.
    fs::create_dir_all(rig.state.join("host-device")).expect("host-device dataDir");
    let cases = host_device_cases(&rig);
    run_group("host-device", "net1", &rig, cases);
    let base = host_device_base(&rig);
    rig.run_plugin("host-device", "net1", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("host-device", "net1", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}
