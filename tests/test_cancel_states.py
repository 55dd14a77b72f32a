"""driver/cancel.py: the states a Cancel leaves on an attempt's iteration subflows. An iteration committed before
the signal landed (it stopped between its commit and its subflow's end) keeps its work, so its subflow ends
Completed; the iteration the signal stopped, and a subflow stopped before it was named, end Cancelled."""
from __future__ import annotations

from tailflow.driver.cancel import end_subflows
from tailflow.driver.subflows import iteration_of


def test_committed_iterations_end_completed_and_the_rest_cancelled(prefect_api):
    """Real flow runs on the session's Prefect server, Running as a Cancel leaves them; ~2 s."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="tailflow-cancel-states")
    def iteration() -> None:
        pass

    line = "[tailflow] run r: cancelled in iteration 0002 (nothing of it is kept); 2 iterations committed"
    with get_client(sync_client=True) as client:
        runs = [client.create_flow_run(iteration, name=name, state=Running())
                for name in ("iter-0000", "iter-0001", "iter-0002", "clever-fox")]
        end_subflows(runs, line, committed=2)
        states = {run.name: client.read_flow_run(run.id).state for run in runs}
    assert {name: state.type.value for name, state in states.items()} == {
        "iter-0000": "COMPLETED", "iter-0001": "COMPLETED", "iter-0002": "CANCELLED", "clever-fox": "CANCELLED"}
    assert states["iter-0002"].message == line
    assert states["iter-0001"].message.startswith("committed before the Cancel") and line in states["iter-0001"].message


def test_the_iteration_of_a_subflow_comes_from_its_name():
    class Named:
        def __init__(self, name):
            self.name = name

    assert [iteration_of(Named(name)) for name in ("iter-0000", "iter-0012", "clever-fox", None, "iter-")] == [
        0, 12, None, None, None]
