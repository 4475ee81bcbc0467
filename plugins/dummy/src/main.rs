//! The dummy plugin: the pod gets a dummy link (no peer, no master) with its addresses from IPAM, e.g. for a
//! stable address that is not tied to any other interface. The shared path of the link plugins is
//! `cnicore::podlink`; a kernel without dummy links gets an error naming CONFIG_DUMMY, the node unchanged.

use cnicore::netlink::{LinkKind, NewLink};
use cnicore::podlink::{self, Addresses, Attachment, Sockets};
use cnicore::spec::{ipam, plugin_main, CniResult, Command, Context, Error, Plugin, Result};

/// The reference reads only the common fields: an IPAM section is required.
fn require_ipam(ctx: &Context) -> Result<()> {
    if podlink::ipam_configured(ctx)? {
        Ok(())
    } else {
        Err(Error::config("dummy interface requires an IPAM configuration"))
    }
}

struct Dummy;

impl Plugin for Dummy {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        require_ipam(ctx)?;
        let mut sockets = Sockets::open(ctx)?;
        let attachment = Attachment {
            ctx,
            link: NewLink { kind: LinkKind::Dummy, parent: None, mtu: None, mac: None },
            in_container: true,
            addresses: Addresses::Ipam,
            dns: ctx.conf.dns.clone(),
        };
        podlink::add(attachment, &mut sockets)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let ipam = ctx.load_for_teardown(require_ipam).is_ok();
        podlink::del(ctx, "dummy", ipam)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        require_ipam(ctx)?;
        ctx.open_netns()?;
        // Before asking IPAM: a missing prevResult is the config's fault, whatever IPAM would say.
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("dummy: Required prevResult missing"))?;
        ipam::exec(ctx, Command::Check)?;
        let link = cnicore::check::pod_link_of_kind(ctx, &prev, "dummy", |_| Ok(()))?;
        if !link.up {
            return Err(Error::internal(format!("Interface {} is down", ctx.env.ifname)));
        }
        Ok(())
    }

    /// The reference has no GC; ours hands it to IPAM.
    fn gc(&self, ctx: &Context) -> Result<()> {
        require_ipam(ctx)?;
        ipam::exec(ctx, Command::Gc)
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        require_ipam(ctx)?;
        ipam::exec(ctx, Command::Status)
    }
}

fn main() {
    plugin_main("CNI dummy plugin (cni-plugins-rs)", &Dummy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ipam_is_required() {
        let ctx = |conf: serde_json::Value| Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), "");
        assert!(require_ipam(&ctx(json!({"cniVersion":"1.1.0","name":"n","type":"dummy","ipam":{"type":"x"}}))).is_ok());
        let e = require_ipam(&ctx(json!({"cniVersion":"1.1.0","name":"n","type":"dummy"}))).unwrap_err();
        assert_eq!(e.code, cnicore::spec::codes::INVALID_CONFIG);
        assert!(require_ipam(&ctx(json!({"cniVersion":"1.1.0","name":"n","type":"dummy","ipam":"x"}))).is_err());
    }
}
