//! The contract suite every Store / DeliveryQueue / SchedulerTable implementation passes.
